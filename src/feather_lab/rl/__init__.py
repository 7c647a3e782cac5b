"""Training of the learned policies (feather-ppo): gymnasium environment, teacher, PPO.

Only trains: the shipped runtime (observation, numpy MLP) lives under policies/, which
never imports this package."""

TRAIN_HARDWARE = "h100"
TRAIN_MODEL = "llama-3-8b"
"""The profiles the shipped feather-ppo weights were trained on: the default of
`env.FeatherEnv`'s cost model and of `train.TrainConfig` (here, so neither imports the other)."""

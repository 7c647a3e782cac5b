"""Training of the learned policies (feather-ppo): gymnasium environment, teacher, PPO.

Only trains: the shipped runtime (observation, numpy MLP) lives under policies/, which
never imports this package."""

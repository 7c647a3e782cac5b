"""A rich progress bar for sb3 training, showing how fast the simulated engine runs.

sb3's own `progress_bar=True` needs tqdm (its `extra`); rich is already a core dependency,
and the number worth watching is the finished episodes' output tokens/s, not the loss.
Imports stable-baselines3: only for `rl.train`.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from stable_baselines3.common.callbacks import BaseCallback


class EpisodeCallback(BaseCallback):
    """Advances a rich bar per decision and records each finished episode's tokens/s."""

    def __init__(
        self,
        total: int,
        show: bool = True,
        on_episode: Callable[[float], None] | None = None,
        window: int = 20,
    ) -> None:
        super().__init__()
        self.total = total
        self.show = show
        self.on_episode = on_episode
        self.window = window
        self.episode_tok_s: list[float] = []
        self._progress: Progress | None = None
        self._task = None

    def _on_training_start(self) -> None:
        if self.show:
            self._progress = Progress(
                TextColumn("training feather-ppo"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=self.total, status="")

    def _on_step(self) -> bool:
        buffer = getattr(self.model, "rollout_buffer", None)
        if hasattr(buffer, "set_next_gaps"):  # StepDiscountBuffer: runs before `add`
            buffer.set_next_gaps(self.locals.get("infos", ()))
        for info, done in zip(self.locals.get("infos", ()), self.locals.get("dones", ())):
            if done and "output_tok_s" in info:
                self.episode_tok_s.append(float(info["output_tok_s"]))
                if self.on_episode is not None:
                    self.on_episode(float(info["output_tok_s"]))
        if self._progress is not None:
            recent = self.episode_tok_s[-self.window :]
            status = (
                f"{len(self.episode_tok_s)} episodes, recent {sum(recent) / len(recent):,.0f} tok/s"
                if recent
                else "first episode"
            )
            self._progress.update(self._task, completed=self.num_timesteps, status=status)
        return True

    def _on_training_end(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=self.num_timesteps)
            self._progress.stop()
            self._progress = None

"""A gym-style wrapper (``reset`` / ``step`` / ``close``, as R2E-Gym and SkyRL-gym use): an
episode is one environment with one shell session; an action is a shell command, the
observation its output. ``step(SUBMIT)`` ends the episode and asks ``reward`` for the reward
(e.g. :func:`evaluate_in_clean_env`: the candidate diff applied in a second, clean
environment with the evaluator)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from weenv._core import EnvSpec, SessionResult
from weenv.client import Client, Environment, Session

#: The action that ends an episode.
SUBMIT = "submit"

RewardFn = Callable[[Environment], float]


class ShellEnv:
    """One episode at a time on ``spec`` (an :class:`EnvSpec`)."""

    def __init__(
        self,
        spec: EnvSpec,
        reward: RewardFn,
        *,
        client: Client | None = None,
        timeout: float | None = 60.0,
        max_steps: int = 100,
    ) -> None:
        self.spec = spec
        self.reward = reward
        self.client = client or Client()
        self.timeout = timeout
        self.max_steps = max_steps
        self.env: Environment | None = None
        self._session: Session | None = None
        self._steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """A fresh environment (the previous one deleted); ``options["spec"]`` replaces fields."""
        self.close()
        spec = replace(self.spec, **(options or {}).get("spec", {}))
        self.env = self.client.create(spec)
        self._session = self.env.session()
        self._steps = 0
        return "", {"env_id": self.env.id, "create_ms": self.env.create_ms}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.env is None or self._session is None:
            msg = "call reset() first"
            raise RuntimeError(msg)
        self._steps += 1
        if action.strip() == SUBMIT:
            r = float(self.reward(self.env))
            return "", r, True, False, {"steps": self._steps}
        res: SessionResult = self._session.run(action, timeout=self.timeout)
        if res.session_closed:
            self._session = self.env.session()
        truncated = self._steps >= self.max_steps
        info = {"exit_code": res.exit_code, "timed_out": res.timed_out, "ms": res.duration_ms}
        return res.text, 0.0, False, truncated, info

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
        self.env = None
        self._session = None


def evaluate_in_clean_env(
    client: Client,
    spec: EnvSpec,
    candidate: Environment,
    *,
    repo: str,
    command: str,
    reward_file: str | None = None,
) -> float:
    """The reward of ``candidate``: its diff of ``repo`` (``git diff`` if ``repo`` is a git
    work tree, else a diff against ``repo.orig``) applied as the task patch of a clean
    environment made from ``spec`` (with the evaluator), where ``command`` runs; the reward
    is the float in ``reward_file`` if given, else 1.0 when ``command`` exits 0."""
    d = candidate.exec(
        f"cd {repo} && (git diff 2>/dev/null || diff -ruN {repo}.orig {repo} | "
        f"sed -e 's#^--- {repo}.orig/#--- a/#' -e 's#^+++ {repo}/#+++ b/#')"
    )
    patch = d.stdout
    with client.create(replace(spec, task=patch or None, task_root=repo)) as ev:
        r = ev.exec(command)
        if reward_file is not None:
            return float(ev.files.read_text(reward_file).strip() or 0)
        return 1.0 if r.exit_code == 0 else 0.0

"""The gym-style wrapper: reset / step / submit / close on a real environment."""

from __future__ import annotations

from weenv import Client, Environment, EnvSpec
from weenv.gym import SUBMIT, ShellEnv


def test_reset_step_submit_close(client: Client, groups: list[str]) -> None:
    def reward(env: Environment) -> float:
        return 1.0 if env.exec("cat /src/repo/app.py").stdout.count(b"return 42") else 0.0

    g = ShellEnv(EnvSpec(groups=groups), reward, client=client, max_steps=3)
    obs, info = g.reset()
    first = info["env_id"]
    assert obs == "" and info["create_ms"] > 0
    obs, r, term, trunc, info = g.step("cd /src/repo && ls")
    assert "app.py" in obs and not term and not trunc and info["exit_code"] == 0
    obs, r, term, trunc, info = g.step("pwd")
    assert obs == "/src/repo\n"
    _, r, term, _, _ = g.step(SUBMIT)
    assert (r, term) == (1.0, True)
    _, info = g.reset()
    assert info["env_id"] != first
    assert first not in [e.id for e in client.list()]
    g.close()
    assert info["env_id"] not in [e.id for e in client.list()]

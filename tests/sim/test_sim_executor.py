"""The simulator runs the production executor of the role machine (rocketray.broker.executor), not a
copy: a seeded run's switches, commits, reports and controller answers all pass through
``Executor.execute`` with the simulated broker as both ports, and a wrong answer parser in the
production executor changes what the simulated brokers do (issue 28: a bug in a production shell
must reach the simulator)."""

from __future__ import annotations

import collections

from rocketray.broker import executor
from rocketray.broker.executor import Executor
from rocketray.sim.broker import SimBroker
from rocketray.sim.run import Sim, SimConfig

SHORT = SimConfig(duration_ms=3000, settle_ms=3000, max_faults=3, faults=("kill", "heal"))


def test_a_seeded_run_executes_every_role_action_through_the_production_executor(monkeypatch):
    seen: collections.Counter[str] = collections.Counter()
    real = Executor.execute

    async def spy(self, action):
        assert isinstance(self.controller, SimBroker) and self.ha is self.controller
        seen[type(action).__name__] += 1
        return await real(self, action)
    monkeypatch.setattr(Executor, "execute", spy)
    r = Sim(3, SHORT).run()
    assert r.ok and r.acked > 0, r.violation
    for name in ("BecomeMaster", "ServeAsMaster", "BecomeSlave", "FollowMaster", "ApplySyncStateSet",
                 "ReportSyncStateSet", "SendHeartbeat", "RequestElection"):
        assert seen[name] > 0, (name, seen)


def _applied_sets(monkeypatch) -> tuple[int, bool]:
    """(SyncStateSets the simulated brokers adopted, run ok) for one short seeded run."""
    applied = collections.Counter()
    real = Executor.execute

    async def spy(self, action):
        applied[type(action).__name__] += 1
        return await real(self, action)
    monkeypatch.setattr(Executor, "execute", spy)
    r = Sim(3, SHORT).run()
    return applied["ApplySyncStateSet"], r.ok


def test_a_wrong_answer_parser_in_the_production_executor_reaches_the_simulated_brokers(monkeypatch):
    """With the executor reading every SyncStateSet answer as refused, the simulated masters adopt
    the sets the controller confirmed only later, by polling: the same seed runs differently."""
    normal, ok = _applied_sets(monkeypatch)
    assert ok and normal > 0
    monkeypatch.setattr(executor, "report_answer",
                        lambda sent, resp: executor.rm.ReportAnswered(executor.rm.ReportOutcome.REFUSED))
    broken, _ = _applied_sets(monkeypatch)
    assert broken != normal, (normal, broken)

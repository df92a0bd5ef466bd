"""Broken rules of the put shell (``ha/put_shell.py``, run by the broker's HA service and by the
simulator alike) for the mutation check (``sim/mutants.py``): each maker takes the shell's method
as the code that runs finds it and returns a plausible one-line bug in its place."""

from __future__ import annotations

__all__ = ["answered_on_write", "wait_timer_kept", "wait_timer_not_rearmed", "release_ignoring_verdict"]


def answered_on_write(original):
    """A written put is answered from its own write (PUT_OK at once), not from its ack wait."""
    from rocketray.ha import ack

    def _write(self, msgs, now_ms, done):
        settled: list = []
        refusal = original(self, msgs, now_ms, settled.append)   # the real write; its wait answers nobody
        if refusal is not None:
            return refusal
        if settled:
            done(settled[0])
            return None
        wait = self.gate.waits[-1]
        done(ack.after_write(True, True, wait.offsets, wait.end))
        return None
    return _write


def wait_timer_kept(_original):
    """The ack-wait timer, once fired, keeps its handle and is not armed again: no later write arms
    one either (it believes one is armed), so no wait of the process times out any more."""
    def _wait_timer_fired(self):
        self.settle()
    return _wait_timer_fired


def wait_timer_not_rearmed(_original):
    """The ack-wait timer is not armed again when it fires: the waits left wait until a later write
    arms it (or an ack, a role change settles them)."""
    def _wait_timer_fired(self):
        self._wait_timer = None
        self.settle()
    return _wait_timer_fired


def release_ignoring_verdict(_original):
    """Every held put is written once the switch ends, whatever the gate's verdict at the release."""
    def release_held(self):
        for (batch, done), _verdict in self.gate.release(self.replica.endpoint_up()):
            result = self._write(batch, self.wall_ms(), done)
            if result is not None:
                done(result)
    return release_held

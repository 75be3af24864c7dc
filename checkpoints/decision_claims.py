"""One decision per approval request, whichever server instance or route it comes through.

A decision reaches a waiting run as a run of the server's (a resume), and two approvers who
decide at the same moment would each be told 200 while the run takes one of them: the server's
hook checks that the approval waits, but both checks pass before either run records anything.
So the hook claims the request first, in the database every instance shares: the first claim
wins, a second gets a 409 naming it. A claim is for one asking (the run, the approval and the
interrupt that asks it): an approval asked again, after a decision the run did not take, is
asked by a new interrupt, and claimed anew. The attempt a decision resumed gives the run's
claims up as it ends (`released`), taken or not: a decision it did not take holds nobody off. A
claim whose run never started (cancelled before it did, its instance gone for good) lapses
after `CLAIM_TTL_S`; the run itself still takes one decision per request, so a lapsed claim can
at worst tell a late second approver 200, never apply two decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopwright.checkpoints.sql import Database

# Long enough for a decision's run to be started and record it on a loaded engine (an
# instance's handover included), short enough that a lost one does not keep the request long.
CLAIM_TTL_S = 60.0


@dataclass(frozen=True)
class DecisionClaim:
    """Who holds the claim on a request, and what they decided."""

    approver: str
    decision: str


class DecisionClaims:
    """The `lw_decision_claims` table (schema v10)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def claim(
        self,
        run_id: str,
        approval_id: str,
        asked: str,
        approver: str,
        decision: str,
        ttl_s: float = CLAIM_TTL_S,
    ) -> DecisionClaim | None:
        """Claim the request for this decision: None if claimed, else the live claim that
        holds it (a retry of the same decision too: the first one is being taken)."""
        key = (run_id, approval_id, asked)
        rows = self.db.write(
            "INSERT INTO lw_decision_claims"
            " (run_id, approval_id, asked, approver, decision, claimed_until)"
            " VALUES (%s, %s, %s, %s, %s, {after_seconds})"
            " ON CONFLICT (run_id, approval_id, asked) DO UPDATE SET approver = excluded.approver,"
            " decision = excluded.decision, claimed_until = excluded.claimed_until"
            " WHERE lw_decision_claims.claimed_until <= now()"
            " RETURNING run_id",
            (*key, approver, decision, ttl_s),
        )
        if rows:
            return None
        held = self.db.one(
            "SELECT approver, decision FROM lw_decision_claims"
            " WHERE run_id = %s AND approval_id = %s AND asked = %s",
            key,
        )
        if held is None:  # lapsed and deleted between the two statements: try again
            return self.claim(run_id, approval_id, asked, approver, decision, ttl_s)
        return DecisionClaim(approver=held["approver"], decision=held["decision"])

    def release(self, run_id: str, approval_id: str, asked: str, approver: str) -> None:
        """Give up this approver's claim (their decision was refused after it was claimed)."""
        self.db.write(
            "DELETE FROM lw_decision_claims"
            " WHERE run_id = %s AND approval_id = %s AND asked = %s AND approver = %s",
            (run_id, approval_id, asked, approver),
        )

    def released(self, run_id: str) -> None:
        """Give up every claim on the run's requests: its attempt has ended, and a decision it
        took is recorded (the request waits no more), one it did not take must not hold the
        request from the next approver."""
        self.db.write("DELETE FROM lw_decision_claims WHERE run_id = %s", (run_id,))

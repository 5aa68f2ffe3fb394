"""A Spark Connect session: no SparkContext, so slots come from the conf, the channel's
address from the way to the server, and a session's first stage checks what the client
cannot see (the executors' versions, whether they reach back here)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from sparktrain.config import RunConfig, conf_keys
from sparktrain.driver.connect_check import ConnectPlan, plan_connect, stage_verdict, unreached_plan
from sparktrain.driver.places.base import Turn
from sparktrain.driver.places.session import SessionPlace
from sparktrain.errors import ConfigurationError
from sparktrain.wire.address import listen_address

if TYPE_CHECKING:
    from sparktrain.driver.launch import Launch
    from sparktrain.task.assignment import TaskJob


class ConnectPlace(SessionPlace):
    """Ranks run in a barrier ``mapInArrow`` stage of a Spark Connect session.

    ``plans`` holds what the runs of one runner found of each session (by its id): the
    first run plans, later ones go on from what it learnt (checked, or detached).
    """

    kind = "Spark Connect"

    def __init__(self, session: Any, plans: dict[str, Any]) -> None:
        super().__init__(session)
        self._plans = plans

    @property
    def plan(self) -> ConnectPlan:
        """The session's plan (see :func:`~sparktrain.driver.connect_check.plan_connect`)."""
        plan: ConnectPlan = self._plans[self.session.session_id]
        return plan

    def _keep(self, plan: ConnectPlan) -> None:
        self._plans[self.session.session_id] = plan

    def conf(self) -> Any:
        from sparktrain.driver.launch.connect import session_conf

        return session_conf(self.session)

    def spark_settings(self, conf: Any) -> dict[str, str]:
        from sparktrain.driver.launch.connect import sparktrain_conf

        return sparktrain_conf(conf, conf_keys())

    def check_elastic(self, config: RunConfig) -> None:
        raise ConfigurationError(
            f"np={config.elastic} is elastic, which needs the cluster's free task slots, "
            "but a Spark Connect client cannot count them: run with a fixed np (e.g. "
            f"np={config.elastic[1] if config.elastic else config.world_size}) under Spark "
            "Connect, or from a classic SparkSession"
        )

    def prepare(self, config: RunConfig, ranks_per_task: int) -> None:
        if self.session.session_id not in self._plans:
            self._keep(plan_connect(self.session, config, ranks_per_task))

    def turn(self) -> Turn | None:
        from sparktrain.driver.launch.connect import shared_slots

        slots = self.plan.slots
        if slots is None:
            return None  # the conf does not say: launch at once, Spark's barrier check waits
        # The client cannot count the live slots: the conf's stand for them.
        return Turn(shared_slots(self.session), lambda: slots, slots)

    def channel_address(self) -> tuple[str, str]:
        address = self.plan.address
        fallback = "::" if ":" in address else "0.0.0.0"
        return listen_address(address, fallback), address

    def launch(self, job: TaskJob, description: str, frame: Any) -> Launch:
        from sparktrain.driver.launch.connect import ConnectLaunch

        return ConnectLaunch(self.session, job, description, frame)

    @property
    def detached(self) -> bool:
        return not self.plan.reachable

    @property
    def checking(self) -> bool:
        return not self.plan.checked

    def passed_checks(self) -> None:
        self._keep(dataclasses.replace(self.plan, checked=True))

    def verdict(self, stage_error: BaseException | None) -> Exception | None:
        return stage_verdict(stage_error) if stage_error is not None else None

    def detach(self, config: RunConfig, why: Exception) -> None:
        from sparktrain.driver.connect_check import ClientUnreachable

        if not isinstance(why, ClientUnreachable):
            raise why
        self._keep(unreached_plan(self.plan, config, why))

    def open_group(self, group: str, description: str) -> None:
        self.session.addTag(group)

    def close_group(self, group: str) -> None:
        self.session.removeTag(group)

    def cancel_group(self, group: str) -> None:
        self.session.interruptTag(group)

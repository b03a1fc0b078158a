"""How every pure core is driven: stimulus ids, steps, the stimulus log.

Owns `StimulusIds`, `Step`, `Stimulus`, `LoggedStimulus`, `StimulusLog` and
`RECENT_STIMULI`, shared by the worker's cores (the slot table, call dispatch)
and the automatic worker's. Every event into a core carries the id of the
stimulus that caused it, stamped by `StimulusIds` where the runtime turns
something that happened into an event. A core answers each event with a
`Step` (a reply for the caller, commands for the runtime) and remembers its
recent events in a bounded `StimulusLog`, so a failing test or a production
log names the event behind a transition.

A leaf: it imports only the standard library and attrs, never anything of
blockx, so any product line may use it without loading another's. Pure: no
clock, no IO, no randomness.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable
from typing import Final, Generic, Protocol, TypeVar

import attrs

__all__ = [
    "RECENT_STIMULI",
    "LoggedStimulus",
    "Step",
    "Stimulus",
    "StimulusIds",
    "StimulusLog",
]

RECENT_STIMULI: Final = 256

ReplyT_co = TypeVar("ReplyT_co", covariant=True)
CommandT_co = TypeVar("CommandT_co", covariant=True)


class Stimulus(Protocol):
    """An event into a core: when it happened and which stimulus it was."""

    @property
    def stimulus_id(self) -> str: ...

    @property
    def now_ms(self) -> int: ...


EventT = TypeVar("EventT", bound=Stimulus)
StepT = TypeVar("StepT", bound="Step[object, object]")


class StimulusIds:
    """Stamps stimulus ids, `<kind>-<n>`, unique within one worker."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def stamp(self, kind: str) -> str:
        return f"{kind}-{next(self._next)}"


@attrs.frozen(kw_only=True)
class Step(Generic[ReplyT_co, CommandT_co]):
    """What one event produced: the reply for the caller and commands for the runtime."""

    reply: ReplyT_co | None = None
    commands: tuple[CommandT_co, ...] = ()


@attrs.frozen(kw_only=True)
class LoggedStimulus:
    """One event a core handled, and what came of it: the commands' names, or the error's."""

    stimulus_id: str
    event: object
    outcome: str


class StimulusLog:
    """The last `RECENT_STIMULI` events of one core, oldest first."""

    def __init__(self) -> None:
        self._recent: collections.deque[tuple[Stimulus, str | tuple[object, ...]]] = (
            collections.deque(maxlen=RECENT_STIMULI)
        )

    @property
    def recent(self) -> tuple[LoggedStimulus, ...]:
        return tuple(
            LoggedStimulus(
                stimulus_id=event.stimulus_id,
                event=event,
                outcome=(
                    outcome
                    if isinstance(outcome, str)
                    else ",".join(type(command).__name__ for command in outcome) or "-"
                ),
            )
            for event, outcome in self._recent
        )

    def apply(self, event: EventT, handle: Callable[[EventT], StepT]) -> StepT:
        """`handle(event)`, logged with its commands, or with the error it raised. The
        record is kept raw (the event, the commands) and made readable only when read."""
        try:
            step = handle(event)
        except Exception as error:
            self._recent.append((event, type(error).__name__))
            raise
        self._recent.append((event, step.commands))
        return step

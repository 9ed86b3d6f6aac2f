"""What a user's home page offers next for one of their things (a reservation, a run)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Action:
    verb: str  # connect | wait | why | take_seat | open | watch | output
    text: str
    url: str = ""
    note: str = ""  # e.g. the idle reclamation countdown

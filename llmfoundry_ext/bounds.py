"""The values a config field's number may take, declared in its type: ``num_workers: NonNegativeInt = 0``. The YAML
converter (``config.build``) checks every field so declared, in one line naming the key, and the schema sweep
(tests/test_config_schema.py) gives each field values outside its range: a field added later is checked by its
declaration, not by a check written for it. Named choices are declared the same way, as ``Literal[...]`` types."""
from dataclasses import dataclass
from typing import Annotated, Optional


@dataclass(frozen=True)
class Bounds:
    """The range of a number: at least ``low`` (above it where ``low_open``), at most ``high``; ``also``: values
    outside it that mean something (-1: all)."""
    low: float
    low_open: bool = False
    high: Optional[float] = None
    also: tuple = ()
    words: Optional[str] = None  # the range in words ('positive'); default '>= low' or '> low'

    def problem(self, value) -> Optional[str]:
        """What is wrong with ``value`` ('must be positive, got 0'), or None."""
        below = value <= self.low if self.low_open else value < self.low
        if value in self.also or not (below or (self.high is not None and value > self.high)):
            return None
        if self.high is not None:
            return f'{value} is out of range; give a whole number from {self.low:,} to {self.high:,}'
        return f'must be {self.text()}, got {value}'

    def text(self) -> str:
        """The range in words: 'positive', '>= 0', '-1 or positive', '0 to 4,294,967,295'."""
        if self.high is not None:
            return f'{self.low:,} to {self.high:,}'
        return ''.join(f'{value} or ' for value in self.also) + (
            self.words or f"{'>' if self.low_open else '>='} {self.low}")


PositiveInt = Annotated[int, Bounds(1, words='positive')]
NonNegativeInt = Annotated[int, Bounds(0)]
AllOrPositiveInt = Annotated[int, Bounds(1, also=(-1,), words='positive')]  # -1: all
PositiveFloat = Annotated[float, Bounds(0, low_open=True, words='positive')]
NonNegativeFloat = Annotated[float, Bounds(0)]
AtLeastOneFloat = Annotated[float, Bounds(1)]
SeedInt = Annotated[int, Bounds(0, high=2 ** 32 - 1)]  # what numpy's and Composer's seeding take

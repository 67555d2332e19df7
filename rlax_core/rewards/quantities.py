"""Numbers as answers write them: separators, signs, currency, percent, magnitude words and units.

``read_quantity("$1\\,250.50 thousand per week")`` reads the number exactly (a ``Fraction``), scales
it by its magnitude words, and names what follows it. The rules are one class, not a list of cases:

* **Thousands separators**: ``,`` and a space, a no-break or thin space, or LaTeX's ``\\,`` ``\\;``
  ``\\:`` ``\\!`` ``\\ `` and ``{,}``, between groups of exactly three digits, the same separator
  throughout (``1,000,000``, ``10 000``, ``1\\,000``, ``1{,}000``; not ``1,23`` nor ``1,000 000``).
* **Magnitude words** scale the number: ``hundred``, ``thousand``, ``million``, ``billion``,
  ``trillion``, ``dozen`` (``18 thousand`` is 18000). They are never dropped.
* **Percent** (``%``, ``\\%``, ``percent``, ``per cent``): the answer equals its number or its number
  divided by 100 (``25%`` answers both "25" and "0.25"; which one a question means is not written).
* **Units** follow the number and are dropped from the value, but only words that are units:
  currency, time, length, mass, volume, area, speed, temperature, angle (``90°``, ``90^\\circ``,
  ``90^{\\circ}``, ``90 degrees``), with ``per``/``/``, ``square``/``cubic`` and ``^2``/``^3``
  (``18 dollars``, ``72 \\text{ km/h}``, ``3 square feet``). A single letter (``m``, ``s``, ``g``) is
  a unit only inside ``\\text{}``/``\\mathrm{}``; elsewhere it may be a variable. Any other trailing
  word (``18 apples``, ``5 less``, ``3 or 4``) makes the text not a quantity.

Units are not converted: two answers with different units are different answers.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

MAX_CHARS = 256  # longer text is not a number an answer writes; reading it stays linear anyway

MAGNITUDES = {"hundred": 100, "thousand": 10 ** 3, "million": 10 ** 6, "billion": 10 ** 9,
              "trillion": 10 ** 12, "dozen": 12}
MAGNITUDE_WORD = re.compile(r"\b(?:hundred|thousand|million|billion|trillion|dozen)s?\b", re.IGNORECASE)
_PERCENT_WORDS = ("percent", "percents", "pct")

# Unit spellings -> one name. Plural "s"/"es" forms are found by stripping them (inches, feet aside).
_UNIT_GROUPS = {
    "dollar": "dollar dollars usd bucks buck", "cent": "cent cents", "euro": "euro euros eur",
    "pound": "pound pounds lb lbs", "yen": "yen", "rupee": "rupee rupees inr", "yuan": "yuan rmb",
    "second": "second sec secs", "minute": "minute min mins", "hour": "hour hr hrs", "day": "day",
    "week": "week wk wks", "month": "month", "year": "year yr yrs", "decade": "decade",
    "century": "century centuries",
    "mm": "mm millimeter millimetre", "cm": "cm centimeter centimetre", "meter": "meter metre",
    "km": "km kilometer kilometre", "inch": "inch inches", "foot": "foot feet ft", "yard": "yard yd yds",
    "mile": "mile", "mg": "mg milligram", "gram": "gram gramme", "kg": "kg kilogram kilo kilos",
    "ounce": "ounce oz", "ton": "ton tonne", "ml": "ml milliliter millilitre", "liter": "liter litre",
    "gallon": "gallon gal gals", "quart": "quart qt", "pint": "pint pt", "cup": "cup",
    "teaspoon": "teaspoon tsp", "tablespoon": "tablespoon tbsp", "acre": "acre", "hectare": "hectare ha",
    "mph": "mph", "kph": "kph kmh", "degree": "degree deg", "celsius": "celsius", "fahrenheit": "fahrenheit",
    "kelvin": "kelvin", "radian": "radian rad rads", "unit": "unit", "calorie": "calorie cal kcal",
    "watt": "watt kw kwh", "byte": "byte kb mb gb",
}
UNITS = {spelling: name for name, spellings in _UNIT_GROUPS.items() for spelling in spellings.split()}
# Written only inside \text{} / \mathrm{} do these single letters count as units (else: variables).
TEXT_ONLY_UNITS = {"m": "meter", "s": "second", "g": "gram", "h": "hour", "l": "liter", "c": "celsius",
                   "f": "fahrenheit", "k": "kelvin"}
_UNIT_GLUE = {"per", "square", "sq", "cubic", "cu"}

_TEXT_COMMAND = re.compile(r"\\(?:text|textrm|textnormal|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_LATEX_SPACE = re.compile(r"\\[,;:! ]|\{,\}|~")
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\circ\b|\\degree\b")
_NUMBER = re.compile(
    r"(?P<grouped>\d{1,3}(?P<sep>[, \u00a0\u2009\u202f\x00])\d{3}(?:(?P=sep)\d{3})*)(?P<fraction>\.\d*)?"
    r"|(?P<digits>\d+)(?P<decimals>\.\d*)?|(?P<bare>\.\d+)")
_LEADING = re.compile(r"\s*(?P<sign1>[-+]?)\s*(?P<currency>\\?\$|€|£|¥|₹)?\s*(?P<sign2>[-+]?)\s*")
_WORD = re.compile(r"[A-Za-z]+\.?|/|\^\s*\{?\s*[23]\s*\}?|[²³]")
_CURRENCIES = {"$": "dollar", "\\$": "dollar", "€": "euro", "£": "pound", "¥": "yen", "₹": "rupee"}
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


@dataclasses.dataclass(frozen=True)
class Quantity:
    value: Fraction  # after magnitude words, before percent
    unit: str | None  # the unit's one name ("dollar", "degree", "km/hour"), None for a bare number
    percent: bool  # written as a percentage: equals ``value`` or ``value / 100``
    approximate: bool  # written with a decimal point: compared with a tolerance, not exactly
    scaled: bool  # a magnitude word multiplied it

    def candidates(self) -> tuple[Fraction, ...]:
        return (self.value, self.value / 100) if self.percent else (self.value,)


def strip_answer(text: str) -> str:
    """Without surrounding space, a final full stop, and one pair of math delimiters (``$...$``, ``\\(...\\)``).

    Only a matched pair is a delimiter: a lone leading ``$`` (``$18``) is a currency sign.
    """
    text = text.strip().removesuffix(".").strip()
    for opener, closer in _DELIMITERS:
        if len(text) >= len(opener) + len(closer) and text.startswith(opener) and text.endswith(closer):
            return text[len(opener):len(text) - len(closer)].strip().removesuffix(".").strip()
    return text


def read_quantity(text: str) -> Quantity | None:
    """``text`` as a number with its magnitude words, percent sign and unit; None if it is anything else."""
    found = _read(text)
    return found if isinstance(found, Quantity) else None


def word_that_is_no_unit(text: str) -> str | None:
    """The first word after the number that is no unit, when ``text`` is a number followed by words.

    ``18 apples``, ``18 less``, ``18 \\text{ or } 20``: a verifier must not take these for 18 (nor let a
    LaTeX parser decide what to drop). None when ``text`` is a quantity or not number-then-words at all.
    """
    found = _read(text)
    return found if isinstance(found, str) else None


def _read(text: str) -> Quantity | str | None:
    if len(text) > MAX_CHARS:
        return None
    text = strip_answer(text)
    text = _LATEX_SPACE.sub("\x00", text)  # a LaTeX space between digit groups is a thousands separator
    in_text = bool(_TEXT_COMMAND.search(text))
    text = _TEXT_COMMAND.sub(lambda m: f" {m.group(1)} ", text)
    text = _DEGREE.sub(" degree ", text).replace("\\%", " percent ").replace("%", " percent ")
    leading = _LEADING.match(text)
    signs = leading.group("sign1") + leading.group("sign2")
    if len(signs) > 1:
        return None
    number = _NUMBER.match(text, leading.end())
    if number is None or number.end() - number.start() > 64:
        return None
    if number.group("grouped"):
        separator = number.group("sep")
        digits = number.group("grouped").replace(separator, "")
        decimals = number.group("fraction") or ""
    else:
        digits = number.group("digits") or "0"
        decimals = number.group("decimals") or number.group("bare") or ""
    value = Fraction(digits + (decimals if decimals not in (".", "") else ""))
    if signs == "-":
        value = -value
    rest = text[number.end():].replace("\x00", " ")
    tail = _read_tail(rest, in_text)
    if not isinstance(tail, tuple):
        # "5x" is a product, not 5 and a word: only a word set apart from its number counts as one.
        return tail if rest[:1].isspace() else None
    scale, percent, unit = tail
    currency = _CURRENCIES.get(leading.group("currency") or "")
    if currency and not (unit or "").startswith(currency):
        unit = f"{currency} {unit}" if unit else currency  # "$18 per week" is "18 dollar / week"
    elif unit and unit[0] == "/":
        return None  # "18 per week": per what?
    return Quantity(value * scale, unit, percent, approximate=len(decimals) > 1, scaled=scale != 1)


def _read_tail(tail: str, in_text: bool) -> tuple[int, bool, str | None] | str | None:
    """``(scale, percent, unit)`` of what follows the number; the first word that is no unit, if
    there is one; None when what follows is not words (``^6``, ``/3``, ``\\pi``)."""
    tail = re.sub(r"\bper\s+cent\b", "percent", tail.strip(), flags=re.IGNORECASE)
    words, position = [], 0
    while position < len(tail):
        if tail[position].isspace():
            position += 1
            continue
        match = _WORD.match(tail, position)
        if match is None:
            return None
        words.append(match.group().lower().rstrip(".").replace(" ", ""))
        position = match.end()
    scale, index = 1, 0
    while index < len(words) and _singular(words[index]) in MAGNITUDES:
        scale *= MAGNITUDES[_singular(words[index])]
        index += 1
    percent = index < len(words) and words[index] in _PERCENT_WORDS
    index += percent
    unit_words: list[str] = []
    for word in words[index:]:
        previous = unit_words[-1] if unit_words else None
        if word in ("/", "per"):
            unit_words.append("/")
        elif word in _UNIT_GLUE:
            unit_words.append(word[:2])
        elif word[0] in "^²³":  # ft^2 is sq ft, m^3 is cu m: one spelling per unit
            if previous in (None, "/", "sq", "cu"):
                return None if previous is None else word
            unit_words.insert(len(unit_words) - 1, "cu" if "3" in word or word == "³" else "sq")
        else:
            # A single letter is a unit in \text{}, after "/" (km/h) or after a degree sign (°C).
            name = _unit_name(word, in_text or previous in ("/", "degree"))
            if name is None:
                return word
            unit_words.append(name)
    if unit_words and unit_words[-1] in ("/", "sq", "cu"):
        return words[-1]
    return scale, percent, " ".join(unit_words) or None


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") and word[:-1] in MAGNITUDES else word


def _unit_name(word: str, in_text: bool) -> str | None:
    for spelling in (word, word[:-1] if word.endswith("s") else None, word[:-2] if word.endswith("es") else None):
        if spelling and spelling in UNITS:
            return UNITS[spelling]
    if in_text and word in TEXT_ONLY_UNITS:
        return TEXT_ONLY_UNITS[word]
    return None


def plain_number(text: str) -> float | None:
    """``"1,234.50"`` / ``"$-7"`` / ``"10 000"`` / ``"3."`` as a float; None for anything that is not a bare number."""
    quantity = read_quantity(text)
    if quantity is None or quantity.percent or quantity.scaled:
        return None
    if quantity.unit and (quantity.unit not in _CURRENCIES.values() or any(c.isalpha() for c in text)):
        return None  # a currency sign is allowed, a unit word is not
    return float(quantity.value)


def quantities_equal(gold: Quantity, prediction: Quantity, relative_tolerance: float) -> bool:
    """Equal values (a percentage: either reading) and no two different units.

    Exact numbers and integer golds compare exactly (``12345678`` is neither ``12345679`` nor
    ``12345679.0``); when either was written with a decimal point and the gold is not an integer, the
    difference may be ``relative_tolerance`` of the gold's size: ``0.333333`` is within 1e-6 of a third.
    """
    if gold.unit and prediction.unit and gold.unit != prediction.unit:
        return False
    approximate = gold.approximate or prediction.approximate
    tolerance = Fraction(str(relative_tolerance))
    return any(numbers_equal(g, p, tolerance if approximate else Fraction(0))
               for g in gold.candidates() for p in prediction.candidates())


def numbers_equal(gold: Fraction, prediction: Fraction, relative_tolerance: Fraction) -> bool:
    """``|prediction - gold| <= relative_tolerance * |gold|``, in exact arithmetic; an integer gold exactly.

    An integer gold takes no tolerance: ``12345678.0`` is ``12345678``, but ``12345679.0`` and
    ``1000000.9`` are not ``12345678`` and ``1000000``, however small the difference is relatively.
    """
    if gold.denominator == 1:
        return prediction == gold
    return abs(prediction - gold) <= relative_tolerance * abs(gold)

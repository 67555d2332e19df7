"""DropExactDuplicates and DropNearDuplicates on small hand-made rows."""

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.data.records import make_example
from transforms.dedup import DropExactDuplicates, DropNearDuplicates

BASE = ("A farmer has 17 sheep and buys 5 more each week for 6 weeks, then sells half of the flock "
        "at the market on Saturday. How many sheep does the farmer have left after the sale?")


def _row(prompt, source="s"):
    return make_example(source=source, prompt=prompt, task="math", answer="1")


def test_exact_and_surface_duplicates_keep_the_smallest_id(pipeline):
    rows = [_row("What is 2 + 2?"), _row("What is 2 + 2?"), _row("  what IS 2 + 2?"), _row("What is 3 + 3?")]
    kept_id = min(r["id"] for r in rows[:3])
    with pipeline as p:
        kept, rejected = p | beam.Create(rows) | DropExactDuplicates()
        assert_that(kept | "KeptIds" >> beam.Map(lambda r: r["id"]),
                    equal_to([kept_id, rows[3]["id"]]), label="kept")
        assert_that(rejected | "Why" >> beam.Map(lambda r: (r["reason"], r["detail"].split(" ")[0])),
                    equal_to([("duplicate", "exact"), ("duplicate", "surface")]), label="rejected")


def test_near_duplicates_above_threshold_are_dropped_distinct_rows_kept(pipeline):
    near = BASE.replace("Saturday", "Sunday")
    other = "Compute the sum of all positive divisors of 360 that are also perfect squares of integers."
    rows = [_row(BASE), _row(near), _row(other)]
    canonical = min(rows[0]["id"], rows[1]["id"])
    dropped = max(rows[0]["id"], rows[1]["id"])
    with pipeline as p:
        kept, rejected = p | beam.Create(rows) | DropNearDuplicates(threshold=0.7)
        assert_that(kept | "KeptIds" >> beam.Map(lambda r: r["id"]), equal_to([canonical, rows[2]["id"]]),
                    label="kept")
        assert_that(rejected | "Why" >> beam.Map(lambda r: (r["id"], r["reason"], r["detail"])),
                    equal_to([(dropped, "near_duplicate", f"near duplicate of {canonical}")]), label="rejected")


def test_near_duplicate_threshold_one_keeps_edited_rows(pipeline):
    rows = [_row(BASE), _row(BASE.replace("Saturday", "Sunday"))]
    with pipeline as p:
        kept, rejected = p | beam.Create(rows) | DropNearDuplicates(threshold=1.0)
        assert_that(kept | beam.Map(lambda r: r["id"]), equal_to([r["id"] for r in rows]), label="kept")
        assert_that(rejected, equal_to([]), label="rejected")

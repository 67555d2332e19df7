"""NgramIndex + DropContaminated: a training row sharing a 13-gram with an eval prompt is dropped."""

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.data.records import make_example
from transforms.decontaminate import DropContaminated, NgramIndex

EVAL = ("Find the number of ordered pairs of positive integers whose product is six hundred and whose sum "
        "is a perfect square less than one hundred.")


def test_leaked_eval_prompt_is_dropped_clean_row_kept(pipeline):
    leak = make_example(source="train", task="math", answer="3",
                        prompt="Warm up first. " + EVAL.upper().replace(" ", "  ") + " Show your work.")
    clean = make_example(source="train", task="math", answer="4",
                         prompt="How many ordered pairs of positive integers have product 600?")
    with pipeline as p:
        index = (p | "Eval" >> beam.Create([make_example(source="aime_test", task="math", prompt=EVAL, answer="3")])
                 | NgramIndex(13))
        kept, dropped = p | "Train" >> beam.Create([leak, clean]) | DropContaminated(index, 13)
        assert_that(kept | "KeptIds" >> beam.Map(lambda e: e["id"]), equal_to([clean["id"]]), label="kept")
        assert_that(dropped | "Dropped" >> beam.Map(lambda d: (d["id"], d["reason"], tuple(d["matched"]))),
                    equal_to([(leak["id"], "contaminated", ("aime_test",))]), label="dropped")


def test_short_eval_prompt_matches_only_as_a_whole(pipeline):
    short_eval = make_example(source="tiny", task="math", prompt="What is 6 times 7?", answer="42")
    same = make_example(source="train", task="math", prompt="what is 6 times 7", answer="42")
    longer = make_example(source="train", task="math", prompt="Explain what is 6 times 7 to a child.", answer="42")
    with pipeline as p:
        index = p | "Eval" >> beam.Create([short_eval]) | NgramIndex(13)
        kept, dropped = p | "Train" >> beam.Create([same, longer]) | DropContaminated(index, 13)
        assert_that(kept | "Kept" >> beam.Map(lambda e: e["id"]), equal_to([longer["id"]]), label="kept")
        assert_that(dropped | "Dropped" >> beam.Map(lambda d: d["id"]), equal_to([same["id"]]), label="dropped")

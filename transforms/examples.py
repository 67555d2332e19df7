"""Raw rows -> Example rows, with every row that cannot become one dead-lettered with its reason."""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.metrics import Metrics

from rlax_core.data.formats import FormatError, to_example
from rlax_core.data.curation import InputSpec, dead_letter, parse_json_line

DEAD_LETTER = "dead_letter"


class _ToExampleFn(beam.DoFn):
    def __init__(self, spec: InputSpec, max_record_bytes: int, prompts_only: bool = False):
        self.spec = spec
        self.max_record_bytes = max_record_bytes
        self.prompts_only = prompts_only
        self.kept = Metrics.counter("curate", "examples")
        self.rejected = Metrics.counter("curate", "dead_lettered")

    def process(self, raw):
        spec = self.spec
        payload = raw["data"] if "data" in raw else raw.get("record")
        try:
            if "error" in raw:  # the reader could not go on in this file (``transforms.io``)
                raise FormatError(*raw["error"])
            if "data" in raw:
                record = parse_json_line(raw["data"], self.max_record_bytes)
            else:
                record = raw["record"]
                size = len(json.dumps(record, default=str).encode("utf-8"))
                if size > self.max_record_bytes:
                    raise FormatError("too_large", f"record is {size} bytes, the limit is {self.max_record_bytes}")
            example = to_example(spec.format, record, source=spec.source, split=spec.split, mapping=spec.mapping,
                                 databases=spec.databases, prompts_only=self.prompts_only,
                                 schema_rows=spec.schema_rows)
        except FormatError as error:
            reason, detail = error.reason, error.detail
        except (TypeError, ValueError, KeyError, AttributeError) as error:  # data no adapter foresaw
            reason, detail = "invalid_record", f"{type(error).__name__}: {error}"
        else:
            self.kept.inc()
            yield example
            return
        self.rejected.inc()
        yield beam.pvalue.TaggedOutput(
            DEAD_LETTER, dead_letter(reason, detail, payload, source=spec.source or spec.format, origin=raw["origin"],
                                     line=raw.get("line"), row=raw.get("row")))


class ToExamples(beam.PTransform):
    """Decode, parse and adapt raw rows of one input; returns ``(examples, dead_letters)``.

    ``prompts_only``: an evaluation set read for decontamination (a SQL row needs no database then).
    """

    def __init__(self, spec: InputSpec, max_record_bytes: int, prompts_only: bool = False):
        super().__init__()
        self.spec, self.max_record_bytes, self.prompts_only = spec, max_record_bytes, prompts_only

    def expand(self, raw_rows):
        adapt = _ToExampleFn(self.spec, self.max_record_bytes, self.prompts_only)
        outputs = raw_rows | "Adapt" >> beam.ParDo(adapt).with_outputs(DEAD_LETTER, main="examples")
        return outputs.examples, outputs[DEAD_LETTER]

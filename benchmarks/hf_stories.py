"""stories260K's SentencePiece tokenizer behind transformers' tokenizer interface, for the TRL and
transformers sides of the benchmarks (the installed protobuf cannot run transformers' own
SentencePiece conversion). Every text gets BOS in front, as the RLAX engine's prompts do, whether or
not the caller asks for special tokens (TRL tokenizes prompts without them)."""

from __future__ import annotations


def stories_hf_tokenizer(model_file: str):
    import sentencepiece
    from transformers import PreTrainedTokenizer

    class StoriesTokenizer(PreTrainedTokenizer):
        model_input_names = ["input_ids", "attention_mask"]

        def __init__(self, **kwargs):
            self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
            super().__init__(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>", **kwargs)

        @property
        def vocab_size(self):
            return self.sp.get_piece_size()

        def get_vocab(self):
            return {self.sp.id_to_piece(i): i for i in range(self.vocab_size)}

        def _tokenize(self, text, **kwargs):
            return ["<s>", *self.sp.encode(text, out_type=str)]

        def _convert_token_to_id(self, token):
            return self.sp.piece_to_id(token)

        def _convert_id_to_token(self, index):
            return self.sp.id_to_piece(index)

        def convert_tokens_to_string(self, tokens):
            return self.sp.decode_pieces([t for t in tokens if t != "<s>"])

    return StoriesTokenizer()

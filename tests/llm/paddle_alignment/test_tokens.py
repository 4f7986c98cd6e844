import numpy as np
import paddle

from paddle_alignment.tokens import decode_responses, left_pad


def test_responses_decode_as_batch_decode_skipping_special_tokens(tmp_path):
    """Special ids dropped before decoding give batch_decode's own skip_special_tokens=True text."""
    from llm.tools.build_tokenizer import build_tokenizer

    tokenizer = build_tokenizer(str(tmp_path))
    special = tokenizer.all_special_ids
    assert len(special) == 3
    rng = np.random.default_rng(0)
    rows = rng.integers(0, len(tokenizer), size=(300, 7)).tolist()
    rows[0] = [104, special[0], 105, *special]
    want = tokenizer.batch_decode(rows, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert decode_responses(tokenizer, rows) == want
    assert want[0] == "hi" and sum(token in special for row in rows for token in row) > 20


def test_left_pad_puts_the_padding_and_the_masked_positions_on_the_left():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.numpy().tolist() == [[5, 6, 7], [0, 0, 8]] and mask.numpy().tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == mask.dtype == paddle.int64

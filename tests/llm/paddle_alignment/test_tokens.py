import numpy as np
import paddle

from paddle_alignment.tokens import decode_responses, end_ids, left_pad, through_first_end


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


def test_responses_end_at_every_end_id_of_the_generation_config(tmp_path):
    """Llama 3.1 Instruct's generation_config.json ends responses at <|eot_id|>, <|eom_id|> and <|end_of_text|>."""
    from llm.tools.build_real_model import build_real_model
    from paddle_alignment.models.loading import load_tokenizer
    from paddle_alignment.rollout.decode import response_mask_from_tokens

    build_real_model("llama-3.2-1b", str(tmp_path), num_layers=1)
    tokenizer = load_tokenizer(str(tmp_path))
    assert end_ids(tokenizer) == [128009, 128001, 128008]  # the EOS first
    responses = paddle.to_tensor([[5, 128008, 6, 128009], [5, 6, 7, 8], [128001, 1, 2, 3]])
    mask, ended = response_mask_from_tokens(responses, end_ids(tokenizer))
    np.testing.assert_array_equal(mask.numpy(), [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert ended.numpy().tolist() == [True, False, True]
    assert [through_first_end(row, end_ids(tokenizer)) for row in responses.numpy().tolist()] == [2, 4, 1]

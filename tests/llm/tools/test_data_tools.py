import itertools
import json
import operator
import re

import pytest

from llm.tools import convert_gsm8k, gen_kk
from paddle_alignment.chat_format import chat_prompt
from paddle_alignment.rewards import get_reward_task

# ---------------------------------------------------------------- gen_kk
#
# The check below reads the puzzle back from its English text with its own parser and solves it by
# brute force, so it tests the rendering as well as the generator's solver.

CLAIM = re.compile(r"(?P<who>I|[A-Z][a-z]+) (?:is|am) a (?P<role>knight|knave)")
PAIR_BOTH = re.compile(r"(?P<a>I|[A-Z][a-z]+) and (?P<b>I|[A-Z][a-z]+) are both (?P<role>knight|knave)s")
PAIR_KIND = re.compile(r"(?P<a>I|[A-Z][a-z]+) and (?P<b>I|[A-Z][a-z]+) are (?P<kind>the same kind|different kinds)")
IMPLICATION = re.compile(r"If (?P<premise>.+) then (?P<conclusion>.+)")
BINARY = {" if and only if ": operator.eq, " or ": operator.or_, " and ": operator.and_}


def person_index(who, names, speaker):
    return speaker if who == "I" else names.index(who)


def parse_claim(text, names, speaker):
    match = CLAIM.fullmatch(text)
    assert match, f"cannot read claim {text!r}"
    person, knight = person_index(match["who"], names, speaker), match["role"] == "knight"
    return lambda assignment: assignment[person] == knight


def parse_statement(sentence, names, speaker):
    """(kind, predicate over an assignment tuple of booleans, True = knight)."""
    if match := PAIR_BOTH.fullmatch(sentence):
        a, b = (person_index(match[key], names, speaker) for key in "ab")
        knight = match["role"] == "knight"
        return "both", lambda assignment: assignment[a] == knight and assignment[b] == knight
    if match := PAIR_KIND.fullmatch(sentence):
        a, b = (person_index(match[key], names, speaker) for key in "ab")
        same = match["kind"] == "the same kind"
        return "kind", lambda assignment: (assignment[a] == assignment[b]) == same
    if match := IMPLICATION.fullmatch(sentence):
        premise = parse_claim(match["premise"], names, speaker)
        conclusion = parse_claim(match["conclusion"], names, speaker)
        return "implies", lambda assignment: not premise(assignment) or conclusion(assignment)
    for word, combine in BINARY.items():
        if word in sentence:
            left, right = (parse_claim(part, names, speaker) for part in sentence.split(word))
            return word.strip(), lambda assignment: combine(left(assignment), right(assignment))
    return "claim", parse_claim(sentence, names, speaker)


def read_puzzle(row):
    names = row["names"]
    lines = row["quiz"].splitlines()
    assert lines[0].endswith(f"You meet {len(names)} inhabitants: {', '.join(names[:-1])} and {names[-1]}.")
    said = [re.fullmatch(r'(\w+) says: "(.+)\."', line) for line in lines[1:-1]]
    assert all(said) and [match[1] for match in said] == names, "each person speaks once, in order"
    return [parse_statement(match[2], names, speaker) for speaker, match in enumerate(said)]


def brute_force_solutions(predicates):
    return [
        list(assignment)
        for assignment in itertools.product((True, False), repeat=len(predicates))
        if all(says(assignment) == assignment[speaker] for speaker, says in enumerate(predicates))
    ]


@pytest.mark.parametrize("num_people", range(gen_kk.MIN_PEOPLE, gen_kk.MAX_PEOPLE + 1))
def test_every_puzzle_has_exactly_its_one_solution(num_people):
    kinds = set()
    for row in gen_kk.generate_puzzles(40, num_people, seed=num_people):
        statements = read_puzzle(row)
        kinds.update(kind for kind, _ in statements)
        assert brute_force_solutions([predicate for _, predicate in statements]) == [row["solution"]]
        assert len(set(row["names"])) == num_people and set(row["names"]) <= set(gen_kk.NAMES)
    assert len(kinds) >= 4


def test_all_statement_kinds_appear():
    kinds = {kind for row in gen_kk.generate_puzzles(100, 4, seed=0) for kind, _ in read_puzzle(row)}
    assert kinds == {"claim", "both", "kind", "implies", "if and only if", "or", "and"}


def test_row_format_matches_ppo_kk():
    kk = get_reward_task("kk")
    for row in gen_kk.generate_puzzles(30, 3, seed=7):
        assert set(row) == {"src", "tgt", "quiz", "names", "solution"}
        expected_tgt = "\n".join(
            f"({index}) {name} is a {'knight' if knight else 'knave'}"
            for index, (name, knight) in enumerate(zip(row["names"], row["solution"]), 1)
        )
        assert row["tgt"] == expected_tgt
        assert row["src"] == chat_prompt(row["quiz"], system=gen_kk.SYSTEM_PROMPT, assistant_prefix="<think>")
        assert row["src"].endswith("<|im_start|>assistant\n<think>")
        perfect = f"Checking each statement.</think>\n<answer>{row['tgt']}</answer><|im_end|>"
        assert kk.score(row["src"], row["tgt"], perfect) == 3.0
        assert kk.score(row["src"], row["tgt"], perfect.replace(" is a ", " might be a ")) == -1.0


def test_same_seed_same_puzzles_other_seed_other_puzzles():
    first = gen_kk.generate_puzzles(25, 4, seed=11)
    assert first == gen_kk.generate_puzzles(25, 4, seed=11)
    assert first[:10] == gen_kk.generate_puzzles(10, 4, seed=11)
    assert [row["quiz"] for row in first] != [row["quiz"] for row in gen_kk.generate_puzzles(25, 4, seed=12)]
    assert len({row["quiz"] for row in first}) == 25


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_cli_writes_disjoint_train_and_test_splits(tmp_path, capsys):
    train_path, test_path = tmp_path / "kk" / "train.jsonl", tmp_path / "kk" / "test.jsonl"
    args = ["--num_samples", "60", "--num_people", "2", "--seed", "3", "--output", str(train_path)]
    gen_kk.main(args + ["--test_size", "20", "--test_output", str(test_path)])
    train, test = read_jsonl(train_path), read_jsonl(test_path)
    assert len(train) == 60 and len(test) == 20
    assert not {row["quiz"] for row in train} & {row["quiz"] for row in test}
    assert train == gen_kk.generate_puzzles(60, 2, seed=3)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--num_people", "9"], "num_people must be between 2 and 8, got 9"),
        (["--num_people", "1"], "num_people must be between 2 and 8, got 1"),
        (["--num_samples", "-1"], "must be >= 0"),
        (["--test_size", "5"], "--test_output"),
    ],
)
def test_cli_rejects_bad_options(tmp_path, capsys, args, words):
    with pytest.raises(SystemExit):
        gen_kk.main(["--output", str(tmp_path / "x.jsonl")] + args)
    assert words in capsys.readouterr().err


# ---------------------------------------------------------------- convert_gsm8k

GOOD_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": "A farm sells 1,234 eggs.", "answer": "It sold 1,234.\n#### 1,234"},
    {"question": "The level drops by 5.", "answer": "#### -5"},
]


def test_convert_row():
    converted = convert_gsm8k.convert_row(GOOD_ROWS[1])
    assert converted["tgt"] == "1234"
    prompt = f"{GOOD_ROWS[1]['question']}\n\n{convert_gsm8k.INSTRUCTION}"
    assert converted["src"] == chat_prompt(prompt, system=convert_gsm8k.SYSTEM_PROMPT)
    assert "#### <number>" in converted["src"] and converted["src"].endswith("<|im_start|>assistant\n")
    assert convert_gsm8k.convert_row(GOOD_ROWS[2])["tgt"] == "-5"


def test_think_answer_prompt_style_asks_for_the_recipes_form_and_its_rule_pays_it():
    converted = convert_gsm8k.convert_row(GOOD_ROWS[0], prompt_style="think_answer")
    assert converted["src"] == chat_prompt(GOOD_ROWS[0]["question"], system=convert_gsm8k.THINK_ANSWER_SYSTEM_PROMPT)
    assert "<think>" in converted["src"] and "<answer>" in converted["src"] and "####" not in converted["src"]
    response = "<think>\n3 + 4 = 7\n</think>\n<answer>\n7\n</answer>"
    assert get_reward_task("math_think_answer").score(converted["src"], converted["tgt"], response) == {"answer": 1.0, "format": 1.25}


def test_converted_targets_work_with_the_math_reward():
    math = get_reward_task("math")
    for row in GOOD_ROWS:
        converted = convert_gsm8k.convert_row(row)
        assert math.score(converted["src"], converted["tgt"], row["answer"]) == 1.0


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_convert_file_skips_blank_lines(tmp_path):
    source = write_lines(tmp_path / "gsm8k.jsonl", [json.dumps(GOOD_ROWS[0]), "", json.dumps(GOOD_ROWS[1])])
    output = tmp_path / "out" / "train.jsonl"
    assert convert_gsm8k.convert_file(source, output) == 2
    assert [row["tgt"] for row in read_jsonl(output)] == ["7", "1234"]


BAD_LINES = {
    "not_json": ('{"question": "x", ', "not valid JSON"),
    "not_an_object": ('["question", "answer"]', "JSON object"),
    "no_question": ('{"answer": "#### 3"}', "'question'"),
    "no_answer": ('{"question": "How many?"}', "'answer'"),
    "answer_not_a_string": ('{"question": "How many?", "answer": 3}', "'answer'"),
    "no_mark": ('{"question": "How many?", "answer": "It is 3."}', "no '####'"),
    "mark_without_number": ('{"question": "How many?", "answer": "#### three"}', "#### <number>"),
}


@pytest.mark.parametrize("line, words", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_bad_row_stops_with_file_and_line(tmp_path, capsys, line, words):
    source = write_lines(tmp_path / "gsm8k.jsonl", [json.dumps(GOOD_ROWS[0]), "", line, json.dumps(GOOD_ROWS[1])])
    output = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match=re.escape(f"{source}:3: ") + ".*" + re.escape(words)):
        convert_gsm8k.convert_file(source, output)
    assert not output.exists()
    with pytest.raises(SystemExit, match=re.escape(f"{source}:3: ")):
        convert_gsm8k.main(["--input", str(source), "--output", str(output)])

"""Generate knights-and-knaves puzzles in PaddleNLP's ppo-kk jsonl format.

Each person makes one statement; statements are small data classes evaluated in Python. A brute-force
solver tries all 2^n knight/knave assignments and only puzzles with exactly one consistent
assignment are kept. Usage:

    python llm/tools/gen_kk.py --num_samples 5000 --num_people 3 --seed 1 --output data/kk/train.jsonl \
        --test_size 500 --test_output data/kk/test.jsonl
"""

import argparse
import itertools
import json
import operator
import random
import sys
from dataclasses import dataclass
from pathlib import Path

if not __package__:
    # Run as a script path: make the `llm` package importable from the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from paddle_alignment.chat_format import chat_prompt  # noqa: E402

NAMES = (
    "Ann", "Anna", "Ben", "Chloe", "Daniel", "Eli", "Elias", "Emma", "Finn", "Grace",
    "Henry", "Isla", "Jack", "Kai", "Lily", "Leo", "Mia", "Noah", "Olivia", "Oliver",
    "Paul", "Quinn", "Rose", "Sam", "Sophia", "Theo", "Uma", "Victor", "Will", "Zoey",
)  # fmt: skip
MIN_PEOPLE, MAX_PEOPLE = 2, 8

SYSTEM_PROMPT = (
    "You solve logic puzzles. First work through the puzzle step by step inside <think> </think>. "
    "Then state who is who inside <answer> </answer>: one person per line, in the order they were "
    "introduced, written as '(1) NAME is a knight' or '(2) NAME is a knave'."
)
INTRO = (
    "On a remote island every inhabitant is either a knight, who always tells the truth, or a knave, "
    "who always lies. You meet {count} inhabitants: {names}."
)
QUESTION = "From what they say, work out who is a knight and who is a knave."

# Give up on a size whose distinct puzzles run out instead of looping forever.
MAX_DUPLICATES_IN_A_ROW = 10_000


def role_word(knight):
    return "knight" if knight else "knave"


def mention(person, names, speaker):
    return "I" if person == speaker else names[person]


def mention_pair(people, names, speaker):
    """Name two people: "Zoey and Oliver", or "Zoey and I" (the speaker goes last)."""
    first, second = sorted(people, key=lambda person: person == speaker)
    return f"{mention(first, names, speaker)} and {mention(second, names, speaker)}"


@dataclass(frozen=True)
class Role:
    """A claim about one person: "X is a knight" / "X is a knave"."""

    person: int
    knight: bool

    def holds(self, assignment):
        return assignment[self.person] == self.knight

    def render(self, names, speaker):
        if self.person == speaker:
            return f"I am a {role_word(self.knight)}"
        return f"{names[self.person]} is a {role_word(self.knight)}"


CONNECTIVES = {
    "and": (operator.and_, "{} and {}"),
    "or": (operator.or_, "{} or {}"),
    "iff": (operator.eq, "{} if and only if {}"),
    "implies": (lambda premise, conclusion: not premise or conclusion, "if {} then {}"),
}


@dataclass(frozen=True)
class Compound:
    """Two role claims joined by a connective, e.g. "X is a knight or Y is a knave"."""

    connective: str
    left: Role
    right: Role

    def holds(self, assignment):
        combine = CONNECTIVES[self.connective][0]
        return combine(self.left.holds(assignment), self.right.holds(assignment))

    def render(self, names, speaker):
        if self.connective == "and" and self.left.knight == self.right.knight:
            both = mention_pair((self.left.person, self.right.person), names, speaker)
            return f"{both} are both {role_word(self.left.knight)}s"
        template = CONNECTIVES[self.connective][1]
        return template.format(self.left.render(names, speaker), self.right.render(names, speaker))


@dataclass(frozen=True)
class SameKind:
    """A claim about two people: "X and Y are the same kind" / "X and Y are different kinds"."""

    first: int
    second: int
    same: bool

    def holds(self, assignment):
        return (assignment[self.first] == assignment[self.second]) == self.same

    def render(self, names, speaker):
        pair = mention_pair((self.first, self.second), names, speaker)
        return f"{pair} are the same kind" if self.same else f"{pair} are different kinds"


def random_statement(rng, speaker, num_people):
    kind = rng.choices(("role", "compound", "same_kind"), weights=(3, 5, 2))[0]
    if kind == "role":
        # "I am a knight" says nothing and "I am a knave" is a paradox: talk about someone else.
        other = rng.choice([person for person in range(num_people) if person != speaker])
        return Role(other, rng.random() < 0.5)
    first, second = rng.sample(range(num_people), 2)
    if kind == "same_kind":
        return SameKind(first, second, rng.random() < 0.5)
    connective = rng.choice(sorted(CONNECTIVES))
    return Compound(connective, Role(first, rng.random() < 0.5), Role(second, rng.random() < 0.5))


def is_consistent(statements, assignment):
    """Knights (True) say true statements, knaves (False) false ones; person i says statements[i]."""
    return all(statement.holds(assignment) == assignment[speaker] for speaker, statement in enumerate(statements))


def solve(statements):
    """Every consistent knight/knave assignment, by trying all 2^n of them."""
    assignments = itertools.product((True, False), repeat=len(statements))
    return [assignment for assignment in assignments if is_consistent(statements, assignment)]


def join_names(names):
    return ", ".join(names[:-1]) + " and " + names[-1]


def render_quiz(names, statements):
    lines = [INTRO.format(count=len(names), names=join_names(names))]
    for speaker, statement in enumerate(statements):
        sentence = statement.render(names, speaker)
        lines.append(f'{names[speaker]} says: "{sentence[0].upper()}{sentence[1:]}."')
    lines.append(QUESTION)
    return "\n".join(lines)


def format_solution(names, solution):
    """The tgt text: `(1) Zoey is a knight` lines in introduction order."""
    lines = (
        f"({index}) {name} is a {role_word(knight)}" for index, (name, knight) in enumerate(zip(names, solution), 1)
    )
    return "\n".join(lines)


def make_puzzle(rng, num_people):
    """One row with a uniquely solvable puzzle, drawing statements until the solution is unique."""
    names = rng.sample(NAMES, num_people)
    while True:
        statements = [random_statement(rng, speaker, num_people) for speaker in range(num_people)]
        solutions = solve(statements)
        if len(solutions) == 1:
            break
    quiz = render_quiz(names, statements)
    solution = list(solutions[0])
    return {
        "src": chat_prompt(quiz, system=SYSTEM_PROMPT, assistant_prefix="<think>"),
        "tgt": format_solution(names, solution),
        "quiz": quiz,
        "names": names,
        "solution": solution,
    }


def distinct_puzzles(num_people, seed):
    """Endless distinct puzzles (by quiz text), in an order fixed by `seed`."""
    rng = random.Random(seed)
    seen_quizzes = set()
    duplicates_in_a_row = 0
    while duplicates_in_a_row < MAX_DUPLICATES_IN_A_ROW:
        row = make_puzzle(rng, num_people)
        if row["quiz"] in seen_quizzes:
            duplicates_in_a_row += 1
            continue
        duplicates_in_a_row = 0
        seen_quizzes.add(row["quiz"])
        yield row
    raise RuntimeError(f"found no new puzzle with {num_people} people after {len(seen_quizzes)} distinct ones")


def generate_puzzles(num_samples, num_people, seed=0, show_progress=False):
    """`num_samples` distinct puzzle rows. The first k rows do not depend on num_samples, so slicing
    one call into train and test splits gives disjoint splits."""
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    if not MIN_PEOPLE <= num_people <= MAX_PEOPLE:
        raise ValueError(f"num_people must be between {MIN_PEOPLE} and {MAX_PEOPLE}, got {num_people}")
    rows = itertools.islice(distinct_puzzles(num_people, seed), num_samples)
    if show_progress:
        from tqdm import tqdm

        rows = tqdm(rows, total=num_samples, desc="kk puzzles")
    return list(rows)


def write_jsonl(path, rows):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=False) + "\n")


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_samples", type=non_negative_int, default=1000, help="puzzles in the training split")
    parser.add_argument("--num_people", type=int, default=3, help=f"people per puzzle, {MIN_PEOPLE}..{MAX_PEOPLE}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True, help="training jsonl")
    parser.add_argument("--test_size", type=non_negative_int, default=0, help="puzzles in a disjoint held-out split")
    parser.add_argument("--test_output", help="held-out jsonl; goes with --test_size > 0")
    args = parser.parse_args(argv)
    if (args.test_size > 0) != (args.test_output is not None):
        parser.error("--test_size > 0 and --test_output go together")
    try:
        rows = generate_puzzles(args.num_samples + args.test_size, args.num_people, args.seed, show_progress=True)
    except ValueError as error:
        parser.error(str(error))
    write_jsonl(args.output, rows[: args.num_samples])
    print(f"wrote {args.num_samples} puzzles to {args.output}")
    if args.test_size:
        write_jsonl(args.test_output, rows[args.num_samples :])
        print(f"wrote {args.test_size} held-out puzzles to {args.test_output}")


if __name__ == "__main__":
    main()

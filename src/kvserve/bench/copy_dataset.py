"""``copy-edit``: a copy-heavy workload, prompts that ask to repeat or lightly edit a passage.

This is the work n-gram speculation (prompt lookup) speeds up: the answer is mostly the prompt's
own text, so the n-grams that end the output recur in the prompt and the tokens after them are
good drafts. Four kinds of prompt, drawn in a seeded rotation::

    repeat    Repeat the following passage exactly, word for word.\\n\\n<passage>\\n\\nRepeated passage:\\n
    replace   Rewrite the passage below with every "<a>" replaced by "<b>" and nothing else changed.
              \\n\\n<passage>\\n\\nRewritten passage:\\n
    spelling  Correct the spelling mistakes in the passage below and change nothing else.
              \\n\\n<passage with 3 words' letters swapped>\\n\\nCorrected passage:\\n
    continue  <passage>\\n\\n<passage>                      (a document quoted twice; the second copy
              is cut after its first sentence, the model completes it)

A passage is a seeded run of consecutive sentences from :data:`SENTENCES` (public-domain English
prose in the manner of the built-in model's corpus), at least ``passage_len`` tokens long under the
target's tokenizer. A request's output length is the token length of the expected answer (the
passage, edited), or ``output_len`` when given. Unlike the random dataset, EOS is not ignored by
default: an instruction-following model stops after the copy.

What a model does with these prompts depends on the model: an instruction-tuned one copies; a
model with random weights ignores the prompt (its drafts from the prompt are then rejected, which
is the adaptive switch's case); the built-in 5M-parameter model knows no instructions, so the
``continue`` kind (a quoted document) is the one it can follow. ``docs/benchmarks.md`` reports
acceptance per model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvserve.bench.datasets import BenchmarkDataset, SampleRequest, _check_positive, register_dataset
from kvserve.bench.prompts import encode
from kvserve.errors import InvalidRequestError

KINDS = ("repeat", "replace", "spelling", "continue")

# Public-domain English prose (sentences after Jane Austen's novels, 1811-1817, reworded), in an
# order that reads as passages when consecutive sentences are taken.
SENTENCES = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune must be in "
    "want of a wife.",
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood, "
    "this truth is so well fixed in the minds of the surrounding families that he is considered the rightful "
    "property of some one or other of their daughters.",
    "Mrs. Bennet was a woman of mean understanding, little information, and uncertain temper.",
    "When she was discontented, she fancied herself nervous, and the business of her life was to get her "
    "daughters married.",
    "Mr. Bennet was so odd a mixture of quick parts, sarcastic humour, reserve, and caprice, that the "
    "experience of three and twenty years had been insufficient to make his wife understand his character.",
    "The family of Dashwood had long been settled in Sussex, and their estate was large.",
    "Their residence was at Norland Park, in the centre of their property, where for many generations they "
    "had lived in so respectable a manner as to engage the general good opinion of their acquaintance.",
    "Elinor, the eldest daughter, possessed a strength of understanding and coolness of judgment which "
    "qualified her, though only nineteen, to be the counsellor of her mother.",
    "Marianne's abilities were in many respects quite equal to Elinor's; she was sensible and clever, but "
    "eager in everything, and her sorrows and her joys could have no moderation.",
    "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and a happy disposition, seemed to "
    "unite some of the best blessings of existence.",
    "She had lived nearly twenty-one years in the world with very little to distress or vex her.",
    "The real evils of her situation were the power of having rather too much her own way, and a disposition "
    "to think a little too well of herself.",
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement, never took "
    "up any book but the Baronetage.",
    "There he found occupation for an idle hour, and consolation in a distressed one.",
    "No one who had ever seen Catherine Morland in her infancy would have supposed her born to be a heroine.",
    "Her situation in life, the character of her father and mother, her own person and disposition, were all "
    "equally against her.",
    "About thirty years ago, Miss Maria Ward, of Huntingdon, with only seven thousand pounds, had the good "
    "luck to captivate Sir Thomas Bertram, of Mansfield Park.",
    "All Huntingdon exclaimed on the greatness of the match, and her uncle, the lawyer, himself allowed her "
    "to be at least three thousand pounds short of any equitable claim to it.",
    "The morning was fine, and the party set out early for the long walk to the village.",
    "Elizabeth, as they drove along, watched for the first appearance of the woods with some perturbation.",
    "The house was a large, handsome stone building, standing well on rising ground, and backed by a ridge "
    "of high woody hills.",
    "She had never seen a place for which nature had done more, or where natural beauty had been so little "
    "counteracted by an awkward taste.",
    "They were all of them warm in their admiration, and at that moment she felt that to be mistress of such "
    "a place might be something.",
    "The letter was long, and she read it twice before she could bring herself to speak of it to her sister.",
    "Every line of it seemed to her to be written with a calmness that she could not answer in the same "
    "spirit.",
    "Her mother, who had been sitting by the window, rose and came towards her with an anxious look.",
    "There was nothing to be done but to wait for the evening, when the gentlemen would return from the town.",
    "The evening passed quietly, and when the carriage was heard at last, the whole family went to the door.",
)

_SWAPS = (("the", "that"), ("and", "but"), ("was", "is"), ("had", "has"), ("her", "his"), ("of", "from"))
_TEMPLATES = {
    "repeat": "Repeat the following passage exactly, word for word.\n\n{passage}\n\nRepeated passage:\n",
    "replace": ('Rewrite the passage below with every "{a}" replaced by "{b}" and nothing else changed.\n\n'
                "{passage}\n\nRewritten passage:\n"),
    "spelling": "Correct the spelling mistakes in the passage below and change nothing else.\n\n"
                "{passage}\n\nCorrected passage:\n",
}


def _passage(rng: np.random.Generator, tokenizer: Any, min_tokens: int) -> list[str]:
    """Two or more consecutive sentences (wrapping around) from a seeded start, at least
    ``min_tokens`` long."""
    start = int(rng.integers(len(SENTENCES)))
    sentences: list[str] = []
    while len(sentences) < 2 or (len(encode(tokenizer, " ".join(sentences))) < min_tokens
                                 and len(sentences) < 4 * len(SENTENCES)):
        sentences.append(SENTENCES[(start + len(sentences)) % len(SENTENCES)])
    return sentences


def _misspell(rng: np.random.Generator, text: str, count: int = 3) -> str:
    """``text`` with the second and third letters of ``count`` seeded words of 5+ letters swapped."""
    words = text.split(" ")
    long = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha() and w[1] != w[2]]
    for i in rng.choice(long, size=min(count, len(long)), replace=False).tolist() if long else []:
        w = words[i]
        words[i] = w[0] + w[2] + w[1] + w[3:]
    return " ".join(words)


def copy_prompt(kind: str, sentences: list[str], rng: np.random.Generator) -> tuple[str, str]:
    """``(prompt, expected answer)`` of one kind for a passage given as sentences."""
    passage = " ".join(sentences)
    if kind == "repeat":
        return _TEMPLATES["repeat"].format(passage=passage), passage
    if kind == "replace":
        present = [(a, b) for a, b in _SWAPS if f" {a} " in passage] or [("the", "that")]
        a, b = present[int(rng.integers(len(present)))]
        return _TEMPLATES["replace"].format(a=a, b=b, passage=passage), passage.replace(f" {a} ", f" {b} ")
    if kind == "spelling":
        return _TEMPLATES["spelling"].format(passage=_misspell(rng, passage)), passage
    if kind == "continue":
        head = sentences[0] + " "
        return passage + "\n\n" + head, " ".join(sentences[1:])
    raise ValueError(f"unknown kind {kind!r}")


@register_dataset
class CopyEditDataset(BenchmarkDataset):
    """See the module docstring.

    Args:
        passage_len: least passage length in tokens (the passage ends at a sentence end).
        output_len: output tokens per request; None = the expected answer's length.
        kinds: which kinds of prompt, rotated in a seeded order.
    """

    name = "copy-edit"

    def __init__(self, passage_len: int = 128, output_len: int | None = None, kinds: tuple[str, ...] = KINDS):
        _check_positive(copy_passage_len=passage_len, **({} if output_len is None else {"output_len": output_len}))
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise InvalidRequestError(f"copy_kinds must name some of {', '.join(KINDS)}, got {list(kinds)}",
                                      "copy_kinds")
        self.passage_len, self.output_len, self.kinds = passage_len, output_len, tuple(kinds)

    @classmethod
    def from_args(cls, args: Any) -> CopyEditDataset:
        output_len = getattr(args, "output_len", None)
        kinds = tuple(k.strip() for k in args.copy_kinds.split(",") if k.strip())
        return cls(args.copy_passage_len, output_len, kinds)

    def sample(self, tokenizer, num_requests, rng):
        n = 64 if num_requests is None else num_requests
        samples = []
        for _ in range(n):
            kind = self.kinds[int(rng.integers(len(self.kinds)))]
            prompt, answer = copy_prompt(kind, _passage(rng, tokenizer, self.passage_len), rng)
            output_len = self.output_len or max(1, len(encode(tokenizer, answer)))
            samples.append(SampleRequest(prompt, encode(tokenizer, prompt), output_len))
        return samples

"""Test reward with mostly zero-std groups: rows with ``signal`` false score a constant 0.5; the others score like
uci_charset (graded, so a group of sampled completions almost surely has spread)."""

ALLOWED = set("abcdefgh12345678qrbn ")


def mostly_flat(completions, signal, **kwargs):
    from rookgrpo.rewards.utils import completion_text  # standard (a string) or conversational (messages)

    texts = [completion_text(c) for c in completions]
    return [
        (sum(c in ALLOWED for c in x) / len(x) if x else 0.0) if s else 0.5
        for x, s in zip(texts, signal)
    ]

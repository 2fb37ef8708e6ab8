"""A ranked full-text index: Okapi BM25 over a fixed document set (the ``research`` env's
``search`` tool)."""

from __future__ import annotations

import math
import re
from collections import Counter


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class BM25Index:
    """Okapi BM25 over a fixed document set (``k1``, ``b`` as in Robertson & Zaragoza 2009).

    ``score(q, d) = sum_{t in set(q)} idf(t) tf(t,d) (k1+1) / (tf(t,d) + k1 (1-b + b |d|/avgdl))``
    with ``idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))``. Ties rank by doc id.
    """

    def __init__(self, docs: dict[str, str], *, k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.ids = sorted(docs)
        self.tf = {i: Counter(tokenize(docs[i])) for i in self.ids}
        self.len = {i: sum(self.tf[i].values()) for i in self.ids}
        self.avgdl = sum(self.len.values()) / max(1, len(self.ids))
        df = Counter(t for i in self.ids for t in self.tf[i])
        n = len(self.ids)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> dict[str, float]:
        terms = set(tokenize(query)) & self.idf.keys()
        out = {}
        for i in self.ids:
            tf, norm = self.tf[i], self.k1 * (1 - self.b + self.b * self.len[i] / self.avgdl)
            s = sum(self.idf[t] * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in terms if tf[t])
            if s > 0:
                out[i] = s
        return out

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        return sorted(self.scores(query).items(), key=lambda x: (-x[1], x[0]))[:k]

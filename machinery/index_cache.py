"""The BM25 index cache: a sparse index (machinery.bm25.SparseBM25) saved once per corpus, BM25
variant and analyzer, and read back by retriever.BM25Retriever.from_jsonl instead of rebuilt.
A file is written atomically and read back only if whole; a damaged one is a ValueError, rebuilt by
the caller."""

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pickle
import unicodedata
import zipfile
from pathlib import Path

import numpy as np

from machinery.bm25 import BM25_VARIANTS, INDEX_VERSION, SparseBM25


def index_cache_file(corpus_path, k1: float, b: float, cache_dir, bm25: str, analyzer: str) -> Path:
    """<cache_dir>/bm25-<corpus name>-<path hash>-<bm25>-<analyzer>-<key hash>.npz. The key covers
    the corpus file's absolute path, size and modification time (as make and rsync judge a file
    changed), the BM25 variant and parameters, and the analyzer with what decides its words
    (Python's Unicode tables; for "english" also the regex and nltk versions): editing or replacing
    the corpus, or changing any of those, misses the cache. Each variant and analyzer has its own
    file name, so indexes of one corpus under different scorings live side by side."""
    path = Path(corpus_path).resolve()
    st = path.stat()
    key = json.dumps(
        [
            st.st_size,
            st.st_mtime_ns,
            k1,
            b,
            bm25,
            analyzer,
            analyzer_version(analyzer),
            INDEX_VERSION,
        ]
    )

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    return (
        Path(cache_dir)
        / f"bm25-{path.stem}-{digest(str(path))}-{bm25}-{analyzer}-{digest(key)}.npz"
    )


def analyzer_version(analyzer: str) -> list[str]:
    """What, besides our code, decides an analyzer's words: the Unicode tables of Python (str.lower,
    \\w) and, for "english", of the regex module (word boundaries) and nltk (the stemmer)."""
    versions = [unicodedata.unidata_version]
    if analyzer == "english":
        stemmer = importlib.util.find_spec("Stemmer") and importlib.metadata.version("PyStemmer")
        versions += [importlib.metadata.version("regex"), importlib.metadata.version("nltk"),
                     f"PyStemmer {stemmer}"]
    return versions


def save_index(index: SparseBM25, path: Path):
    """Write a sparse index as one .npz, atomically (temp file in the same folder, then rename).
    Raises OSError (a read-only or full disk, a file where the folder should be) after removing the
    temp file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # no word holds a newline
    words = np.frombuffer("\n".join(index.vocab).encode("utf-8"), dtype=np.uint8)
    idf = np.zeros(0, np.float32) if index.idf is None else index.idf
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, vocab=words, indptr=index.indptr, docs=index.docs, values=index.values,
                     num_docs=index.num_docs, variant=np.array(index.variant), idf=idf)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # no half-written index left to fill the disk
        raise


def load_index(path: Path) -> SparseBM25:
    """Read an index written by `save_index`. Raises OSError if the file cannot be opened, and
    ValueError "<path>: damaged index file (...)" for anything else np.load and the checks below can
    hit on a truncated, garbage or foreign file (a zip's CRC catches flipped bits too), so that
    callers can rebuild on one exception type."""
    try:
        # allow_pickle=False: a garbage file is a ValueError, never unpickled
        with np.load(path) as z:
            words = z["vocab"].tobytes().decode("utf-8").split("\n")
            variant = str(z["variant"])
            index = SparseBM25({w: t for t, w in enumerate(words)}, z["indptr"], z["docs"],
                               z["values"],
                               int(z["num_docs"]), variant,
                               z["idf"] if variant == "lucene" else None)
    except (zipfile.BadZipFile, EOFError, ValueError, KeyError, TypeError, IndexError,
            pickle.UnpicklingError) as e:
        raise ValueError(f"{path}: damaged index file ({type(e).__name__}: {e})") from None
    if (
        len(index.indptr) != len(words) + 1
        or not index.indptr[-1] == len(index.docs) == len(index.values)
        or variant not in BM25_VARIANTS
        or (variant == "lucene" and len(index.idf) != len(words))
    ):
        raise ValueError(f"{path}: damaged index file (inconsistent index arrays)")
    return index

import dataclasses

import numpy as np

from data_config import data_config
from ledgerlm.config import BuiltinCorpusConfig, DataConfig, EvalConfig, PackConfig, TokenizerConfig
from ledgerlm.data.pipeline import SPLITS, prepare_data
from ledgerlm.data.verify import iter_split
from ledgerlm.tokens.loader import test_batches, train_batches, validation_batches
from ledgerlm.tokens.shards import TokenStore, build_tokens
from ledgerlm.workspace import Workspace

DATA = DataConfig(
    builtin=BuiltinCorpusConfig(code_docs=12, docs_docs=6, math_docs=20, max_doc_chars=2000),
    val_fraction=0.25,
)
TOK = TokenizerConfig(vocab_size=400)


def _build(tmp_path, data_cfg: DataConfig = DATA):
    ws = Workspace(tmp_path)
    data = prepare_data(data_cfg, ws)
    return ws, data, build_tokens(data, TOK, ws)


def test_shards_decode_back_to_the_documents(tmp_path):
    _, data, tokens = _build(tmp_path)
    store = TokenStore(tokens.path)
    index = store.index.to_pylist()
    texts = {}
    for split in SPLITS:
        for table in iter_split(data.path, data.manifest, split):
            texts.update(
                zip(table.column("id").to_pylist(), table.column("text").to_pylist(), strict=True)
            )
    assert len(index) == len(texts) == data.manifest["counts"]["kept"]
    for row in index:
        ids = store.tokens(row["shard"], row["offset"], row["length"])
        assert store.tokenizer.decode(ids.tolist()) == texts[row["doc_id"]]
    total = {f["split"]: f["tokens"] for f in tokens.manifest["files"]}
    for split in SPLITS:
        assert total[split] == sum(r["length"] for r in index if r["split"] == split)
    assert sum(c["tokens"] for c in tokens.manifest["counts"]) == sum(total.values())


def test_tokenizer_and_shards_are_deterministic_and_reused(tmp_path):
    _, _, a = _build(tmp_path / "a")
    _, _, b = _build(tmp_path / "b")
    assert a.version == b.version
    assert a.manifest["tokenizer"]["sha256"] == b.manifest["tokenizer"]["sha256"]
    assert [f["sha256"] for f in a.manifest["files"]] == [f["sha256"] for f in b.manifest["files"]]
    ws, data, _ = _build(tmp_path / "a")
    assert build_tokens(data, TOK, ws).reused


def test_train_stream_is_seeded_and_validation_is_fixed(tmp_path):
    _, _, tokens = _build(tmp_path)
    store = TokenStore(tokens.path)
    pack = PackConfig(seq_len=32)

    def first(seed, n=5):
        it = train_batches(store, pack, 4, seed)
        return [next(it).input_ids for _ in range(n)]

    assert all(np.array_equal(x, y) for x, y in zip(first(0), first(0), strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(first(0), first(1), strict=True))
    cfg = EvalConfig(max_tokens=600)
    v1, v2 = validation_batches(store, pack, cfg, 4), validation_batches(store, pack, cfg, 4)
    assert all(np.array_equal(a.input_ids, b.input_ids) for a, b in zip(v1, v2, strict=True))
    domains = {int(d) for b in v1 for d in b.target_domains[b.loss_mask].unique()}
    assert domains == set(range(len(store.domains)))  # every domain is measured
    assert sum(int(b.valid.sum()) for b in v1) <= cfg.max_tokens + pack.seq_len


def test_epoch_visits_follow_dedup_weights():
    from ledgerlm.tokens.loader import epoch_order

    order = epoch_order(np.array([1.0, 3.0, 1.0]), seed=0, epoch=0)
    assert sorted(order.tolist()) == [0, 1, 1, 1, 2]
    assert np.array_equal(order, epoch_order(np.array([1.0, 3.0, 1.0]), seed=0, epoch=0))
    assert sorted(epoch_order(np.ones(4), 0, 1).tolist()) == [0, 1, 2, 3]


def test_preserve_weights_reach_the_token_index(tmp_path):
    import json

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(500)]
    rows = [{"id": f"d{i}", "text": " ".join(rng.choice(words, 80))} for i in range(12)]
    rows += [{"id": f"copy{k}", "text": rows[3]["text"]} for k in range(2)]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    cfg = data_config(tmp_path / "c.jsonl", weights="preserve", val_fraction=0.3)
    ws = Workspace(tmp_path / "ws")
    store = TokenStore(build_tokens(prepare_data(cfg, ws), TOK, ws).path)
    weights = dict(
        zip(
            store.index.column("doc_id").to_pylist(),
            store.index.column("weight").to_pylist(),
            strict=True,
        )
    )
    assert weights["d3"] == 3.0
    assert all(w == 1.0 for k, w in weights.items() if k != "d3")


def test_no_test_split_means_an_empty_shard_and_no_test_batches(tmp_path):
    _, data, tokens = _build(tmp_path)  # test_fraction = 0
    assert data.manifest["counts"]["by_split"]["test"] == 0
    assert list(iter_split(data.path, data.manifest, "test")) == []
    files = {f["split"]: f for f in tokens.manifest["files"]}
    assert files["test"]["tokens"] == 0 and (tokens.path / "test.bin").stat().st_size == 0
    store = TokenStore(tokens.path)
    docs = store.split_docs("test")
    assert set(docs) == {"shard", "offset", "length", "domain", "weight"}
    assert all(len(v) == 0 for v in docs.values())
    pack, cfg = PackConfig(seq_len=32), EvalConfig(max_tokens=600)
    assert test_batches(store, pack, cfg, 4) == []
    assert validation_batches(store, pack, cfg, 4)  # val is unaffected


class _Reads:
    """A token store that records which documents a batch builder reads."""

    def __init__(self, store: TokenStore, rename: dict[str, str] | None = None) -> None:
        self.store, self.rename, self.read = store, rename or {}, []
        self.special, self.domains = store.special, store.domains
        self.doc_at: dict[tuple[str, int], list[str]] = {}
        for r in store.index.to_pylist():  # an empty document shares its offset
            self.doc_at.setdefault((r["shard"], r["offset"]), []).append(r["doc_id"])

    def split_docs(self, split):
        return self.store.split_docs(self.rename.get(split, split))

    def tokens(self, shard, offset, length):
        self.read += self.doc_at[(shard, offset)]
        return self.store.tokens(shard, offset, length)


def test_a_test_split_reaches_the_token_store_and_test_batches(tmp_path):
    cfg = DATA.model_copy(update={"test_fraction": 0.2})
    _, data, tokens = _build(tmp_path, cfg)
    counts = data.manifest["counts"]
    assert counts["by_split"]["test"] > 0
    assert sum(counts["by_split"].values()) == counts["kept"]
    store = TokenStore(tokens.path)
    index = store.index.to_pylist()
    split_of_doc = {r["doc_id"]: r["split"] for r in index}
    assert len(split_of_doc) == len(index) == counts["kept"]  # no document in two splits
    test_ids = {
        i for t in iter_split(data.path, data.manifest, "test") for i in t.column("id").to_pylist()
    }
    assert test_ids == {d for d, s in split_of_doc.items() if s == "test"}
    assert {r["shard"] for r in index if r["split"] == "test"} == {"test.bin"}
    assert len(store.split_docs("test")["length"]) == counts["by_split"]["test"]

    pack, ecfg = PackConfig(seq_len=32), EvalConfig(max_tokens=600, test_max_tokens=400)
    # by default the whole split: every test document, every pair of its tokens a
    # target but where a row ends inside it
    reads_whole = _Reads(store)
    whole = test_batches(reads_whole, pack, EvalConfig(max_tokens=600), 4)
    assert sorted(reads_whole.read) == sorted(test_ids)
    docs = store.split_docs("test")
    pairs = int(docs["length"].sum()) + len(docs["length"])  # BOS..EOS: length + 1 each
    rows = sum(len(b.input_ids) for b in whole)
    assert pairs - rows < sum(b.num_targets for b in whole) <= pairs
    reads_test, reads_val = _Reads(store), _Reads(store)
    test = test_batches(reads_test, pack, ecfg, 4)
    val = validation_batches(reads_val, pack, ecfg, 4)
    assert test and sum(b.num_targets for b in test) > 0 and val
    assert sum(int(b.valid.sum()) for b in test) <= ecfg.test_max_tokens + pack.seq_len
    assert sum(b.num_targets for b in test) < sum(b.num_targets for b in whole)
    assert reads_test.read and set(reads_test.read) <= test_ids
    assert reads_val.read
    assert set(reads_val.read) <= {d for d, s in split_of_doc.items() if s == "val"}
    assert not set(reads_test.read) & set(reads_val.read)
    # capped and packed exactly like the validation set: the same builder, max_tokens
    # shared by domain, over the test documents
    capped = EvalConfig(max_tokens=ecfg.test_max_tokens)
    same = validation_batches(_Reads(store, {"val": "test"}), pack, capped, 4)
    assert len(same) == len(test)
    for a, b in zip(same, test, strict=True):
        for field in dataclasses.fields(a):
            assert (getattr(a, field.name) == getattr(b, field.name)).all(), field.name
    again = test_batches(store, pack, ecfg, 4)
    assert all((a.input_ids == b.input_ids).all() for a, b in zip(test, again, strict=True))

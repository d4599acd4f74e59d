"""Published GPU/TPU measurements on their chips' rooflines (issue 38): one record per corpus row,
placed by its bound (exact FLOPs over compulsory bytes, issue 49), measured FLOP/s (exact FLOPs
over the published time) beside the bound's; and one record per published serving-system result
(`row_kind` "system"): measured against its system bound and its prediction held out by
implementation."""

from kvjax.predict.corpus import read_corpus
from kvjax.predict.validate import validate
from kvjax.serving.systems import read_systems, validate_systems

SYSTEM_KEEP = ("source", "source_group", "implementation", "chip", "num_chips", "model",
               "scenario", "metric", "scope", "measured", "bound_value", "bound_side",
               "fraction_of_bound", "above_bound", "predicted_value", "predicted_lo",
               "predicted_hi", "input_len", "output_len")  # fmt: skip

# a kernel row's columns the records keep
KEEP = (
    "source chip dtype kernel implementation measured_s confidence bound_flops bound_bytes "
    "bound_intensity closed_flops closed_bytes closed_intensity peak_flops_per_s "
    "bandwidth_bytes_per_s bound_s bound_side fraction_of_bound above_bound predicted_s "
    "predicted_lo_s predicted_hi_s held_out_predicted_s num_chips source_group head_dim seq_q "
    "seq_kv causal batch m n k best_of_shape timing window page_size schedule programs stretch "
    "l2_flushed clock_locked"
)

OPTIONS: dict = {}


def run_point(point) -> list[dict]:
    report = validate(read_corpus())
    keep = KEEP.split()
    records = []
    for row in report["rows"]:
        rec = {k: row[k] for k in keep}
        rec["num_chips"] = chips = row["num_chips"] or 1  # per chip below: the roofs of one
        rec["measured_flops_per_s"] = row["bound_flops"] / row["measured_s"] / chips
        rec["bound_flops_per_s"] = row["bound_flops"] / row["bound_s"] / chips
        rec["chip_peak_flops_per_s"] = row["peak_flops_per_s"] / chips
        rec["chip_bandwidth_bytes_per_s"] = row["bandwidth_bytes_per_s"] / chips
        rec["where"] = f"{row['file'].rsplit('/', 1)[-1]}:{row['line']}"
        rec["row_kind"] = "kernel"
        records.append(rec)
    rows, _ = validate_systems(read_systems())
    for row in rows:
        rec = {k: row.get(k) for k in SYSTEM_KEEP}
        rec.update(row_kind="system", where=row["file_line"], kernel=None)
        records.append(rec)
    return records

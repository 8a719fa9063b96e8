// merge — result sets of any studies joined into one long-format CSV: one row per (set, row of its
// results.csv, metric), with the metric's unit and the provenance a plot or a table needs (the
// set's directory, generator and commit; the row's model, policy, μ and site where it has them;
// its other design columns). Every set is verified against its manifest first (study.h), so a
// set changed after it was written is refused, never merged.
#pragma once

#include <string>
#include <vector>

namespace mantis {

// The unit of a results.csv column by its name: its last suffix (study.h: `_seconds` → "s",
// `_bytes` → "bytes", `_nats` → "nats", `_tokens` → "tokens", `_elements` → "elements"; a bracketed
// qualifier after it is ignored), else what a dimensionless name is ("count", "perplexity", "1" for
// ratios and rates, "logit"); "unknown" when the name does not say.
std::string metric_unit(const std::string& column);

// The merged CSV (header: source,generator,git_commit,row,model,policy,mu,site,design,metric,value,unit).
// InputError naming the directory for a missing or unverifiable set or a malformed results.csv.
std::string merge_result_sets(const std::vector<std::string>& dirs);

}  // namespace mantis

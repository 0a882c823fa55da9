//! Cutting a job's papers into mini-batches (one forward pass each) by the plan's rule.
//!
//! The model packs sequences without padding, so a mini-batch costs its real tokens; the
//! padding counts here are what a padded implementation (the study's) would have spent, kept for
//! the report and the benchmark that compares the two rules.

use embedfleet_core::settings::MiniBatchRule;

/// One paper (or chunk) to embed: its position in the job and its token count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    pub index: usize,
    pub n_tokens: usize,
    pub n_chars: u64,
}

/// Groups `items` into mini-batches of item indexes (positions in `items`).
///
/// - `Chars`: corpus order; a mini-batch closes before it would pass `max_chars` characters or
///   `max_papers` papers (the study's heuristic).
/// - `TokenBudget`: longest first, so similar lengths share a pass and the first pass is the
///   largest (an out-of-memory shows at once); a mini-batch closes before its padded size
///   (papers × longest, TEI's rule for padded models) would pass `max_tokens`. Counting padded
///   size keeps memory bounded for a padded forward too and groups similar lengths. A single
///   item over the budget gets a mini-batch of its own.
pub fn minibatches(items: &[Item], rule: &MiniBatchRule) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    if let MiniBatchRule::TokenBudget { .. } = rule {
        order.sort_by_key(|&i| (std::cmp::Reverse(items[i].n_tokens), i));
    }
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let (mut chars, mut longest) = (0u64, 0u64);
    for i in order {
        let item = items[i];
        let full = !current.is_empty()
            && match *rule {
                MiniBatchRule::Chars {
                    max_chars,
                    max_papers,
                } => current.len() as u32 >= max_papers || chars + item.n_chars > max_chars,
                MiniBatchRule::TokenBudget { max_tokens } => {
                    (current.len() as u64 + 1) * longest.max(item.n_tokens as u64) > max_tokens
                }
            };
        if full {
            batches.push(std::mem::take(&mut current));
            chars = 0;
            longest = 0;
        }
        current.push(i);
        chars += item.n_chars;
        longest = longest.max(item.n_tokens as u64);
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Real and padding tokens of mini-batches run padded to their longest sequence.
pub fn padding(items: &[Item], batches: &[Vec<usize>]) -> (u64, u64) {
    let mut real = 0u64;
    let mut padded = 0u64;
    for batch in batches {
        let longest = batch.iter().map(|&i| items[i].n_tokens).max().unwrap_or(0) as u64;
        let sum: u64 = batch.iter().map(|&i| items[i].n_tokens as u64).sum();
        real += sum;
        padded += longest * batch.len() as u64 - sum;
    }
    (real, padded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(tokens: &[usize]) -> Vec<Item> {
        tokens
            .iter()
            .enumerate()
            .map(|(index, &n)| Item {
                index,
                n_tokens: n,
                n_chars: n as u64 * 4,
            })
            .collect()
    }

    #[test]
    fn chars_rule_keeps_corpus_order_and_both_limits() {
        let it = items(&[10, 10, 10, 100, 5, 5, 5, 5, 5]);
        let rule = MiniBatchRule::Chars {
            max_chars: 200,
            max_papers: 3,
        };
        assert_eq!(
            minibatches(&it, &rule),
            vec![vec![0, 1, 2], vec![3], vec![4, 5, 6], vec![7, 8]]
        );
    }

    #[test]
    fn token_budget_sorts_longest_first_and_isolates_oversized_items() {
        let it = items(&[3, 50, 4, 20, 20, 2]);
        let rule = MiniBatchRule::TokenBudget { max_tokens: 40 };
        assert_eq!(
            minibatches(&it, &rule),
            vec![vec![1], vec![3, 4], vec![2, 0, 5]]
        );
        let all: usize = minibatches(&it, &rule).iter().map(Vec::len).sum();
        assert_eq!(all, it.len(), "every item is in exactly one mini-batch");
    }

    #[test]
    fn sorting_by_length_cuts_padding() {
        let it = items(&[100, 2, 90, 3, 80, 4, 70, 5]);
        let study = minibatches(
            &it,
            &MiniBatchRule::Chars {
                max_chars: 10_000,
                max_papers: 2,
            },
        );
        let sorted = minibatches(&it, &MiniBatchRule::TokenBudget { max_tokens: 200 });
        let (real_a, pad_a) = padding(&it, &study);
        let (real_b, pad_b) = padding(&it, &sorted);
        assert_eq!(real_a, real_b);
        assert_eq!(pad_a, 98 + 87 + 76 + 65);
        assert!(pad_b < pad_a / 4, "{pad_b} vs {pad_a}");
    }
}

//! Data-parallel work on long lists: one part per core, results in list order, so a caller's
//! output is the same on one core or many. Must not be used where parts depend on each other.

/// Below this many items a list is one part, worked here.
pub const PARTS_FROM: usize = 4096;

/// `f` over `items` cut into one part per core (at most 8): each call gets its part's start
/// and the part; the results come back in order. A short list is one call, on this thread.
pub fn in_parts<'a, T: Sync, R: Send>(
    items: &'a [T],
    f: impl Fn(usize, &'a [T]) -> R + Sync,
) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    if items.len() < PARTS_FROM || threads == 1 {
        return vec![f(0, items)];
    }
    let size = items.len().div_ceil(threads);
    std::thread::scope(|s| {
        let f = &f;
        let running: Vec<_> = (items.chunks(size).enumerate())
            .map(|(k, part)| s.spawn(move || f(k * size, part)))
            .collect();
        running
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_list_in_order() {
        for n in [0, 1, PARTS_FROM - 1, PARTS_FROM, 3 * PARTS_FROM + 7] {
            let items: Vec<usize> = (0..n).collect();
            let seen: Vec<usize> = in_parts(&items, |start, part| {
                assert!(part.iter().enumerate().all(|(k, v)| *v == start + k));
                part.to_vec()
            })
            .into_iter()
            .flatten()
            .collect();
            assert_eq!(seen, items);
        }
    }
}

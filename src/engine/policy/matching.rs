//! Greedy maximum matching on a class graph. Jobs arrive in priority order, each with a job
//! class; TPUs are grouped into TPU classes with a capacity. A job is matched exactly when it
//! can be added to the earlier matched jobs by an augmenting path — the original's Kuhn
//! matching, whose matched set in a given order is unique (the greedy basis of a transversal
//! matroid). Paths are searched on classes, not on single jobs and TPUs, and a failed search
//! retires every class it reached, so the cost grows with the number of jobs plus successful
//! augmentations × class edges (failed searches read each class edge once in all), instead
//! of jobs × TPUs × edges.

/// The class graph.
#[derive(Clone, Debug)]
pub struct ClassGraph {
    /// Per job class: compatible TPU classes, in preference order.
    pub compat: Vec<Vec<u32>>,
    /// Per TPU class: how many free TPUs it holds.
    pub capacity: Vec<u32>,
}

/// Result: per job (input order), the TPU class it gets, if matched.
pub fn greedy_match(graph: &ClassGraph, job_classes: &[u32]) -> Vec<Option<u32>> {
    let n_job_classes = graph.compat.len();
    let n_tpu_classes = graph.capacity.len();
    // flow[jc][k]: units from job class jc to its k-th compatible TPU class.
    let mut flow: Vec<Vec<u32>> = graph.compat.iter().map(|c| vec![0; c.len()]).collect();
    let mut used = vec![0u32; n_tpu_classes];
    // users[tc]: (job class, position in its compat list) that ever sent flow into tc.
    let mut users: Vec<Vec<(u32, u32)>> = vec![Vec::new(); n_tpu_classes];
    let mut dead = vec![false; n_job_classes];
    // TPU classes a failed search reached: full, and every path out of them leads back into
    // what that search saw, so no later augmenting path enters them (their flows never
    // change again). Later searches skip them, and find the same paths.
    let mut dead_tc = vec![false; n_tpu_classes];
    let mut matched = vec![false; job_classes.len()];

    // BFS scratch, reused; `stamp` avoids clearing between searches.
    let mut stamp = 0u32;
    let mut seen_jc = vec![0u32; n_job_classes];
    let mut seen_tc = vec![0u32; n_tpu_classes];
    // Parent of a TPU class: (job class, compat position) that reached it.
    let mut parent_tc = vec![(0u32, 0u32); n_tpu_classes];
    // Parent of a job class: the TPU class it was reached through (and its compat position).
    let mut parent_jc = vec![(u32::MAX, 0u32); n_job_classes];
    let mut queue: Vec<u32> = Vec::new();
    let mut visited: Vec<u32> = Vec::new();
    let mut visited_tc: Vec<u32> = Vec::new();
    // Per job class: no compatible class before this position has a free TPU. A class once
    // full stays full (`used` only grows), so the fast path scans each list once in all,
    // not once per job (a sweep queue's unconstrained class lists every TPU class).
    let mut first_free = vec![0usize; n_job_classes];

    for (j, &jc) in job_classes.iter().enumerate() {
        let jc_us = jc as usize;
        if dead[jc_us] {
            continue;
        }
        // Fast path: a compatible class with a free TPU.
        let compat = &graph.compat[jc_us];
        let start = first_free[jc_us];
        let free = compat[start..]
            .iter()
            .position(|&tc| used[tc as usize] < graph.capacity[tc as usize]);
        first_free[jc_us] = free.map_or(compat.len(), |k| start + k);
        if let Some(k) = free.map(|k| start + k) {
            let tc = compat[k];
            add_flow(&mut flow, &mut users, jc, k as u32, tc);
            used[tc as usize] += 1;
            matched[j] = true;
            continue;
        }
        // Augmenting path search on the residual class graph.
        stamp += 1;
        queue.clear();
        visited.clear();
        visited_tc.clear();
        queue.push(jc);
        seen_jc[jc_us] = stamp;
        parent_jc[jc_us] = (u32::MAX, 0);
        visited.push(jc);
        let mut found: Option<u32> = None;
        let mut head = 0;
        'search: while head < queue.len() {
            let cur = queue[head];
            head += 1;
            for (k, &tc) in graph.compat[cur as usize].iter().enumerate() {
                let tcu = tc as usize;
                if seen_tc[tcu] == stamp || dead_tc[tcu] {
                    continue;
                }
                seen_tc[tcu] = stamp;
                visited_tc.push(tc);
                parent_tc[tcu] = (cur, k as u32);
                if used[tcu] < graph.capacity[tcu] {
                    found = Some(tc);
                    break 'search;
                }
                for &(other, pos) in &users[tcu] {
                    let o = other as usize;
                    if seen_jc[o] != stamp && flow[o][pos as usize] > 0 {
                        seen_jc[o] = stamp;
                        parent_jc[o] = (tc, pos);
                        queue.push(other);
                        visited.push(other);
                    }
                }
            }
        }
        match found {
            None => {
                // Nothing reachable from here has room; no later job of any reached class can
                // be added either (matroid exchange), so they are all dead.
                for &v in &visited {
                    dead[v as usize] = true;
                }
                for &t in &visited_tc {
                    dead_tc[t as usize] = true;
                }
            }
            Some(free) => {
                used[free as usize] += 1;
                matched[j] = true;
                // Walk back: each hop moves one unit of flow.
                let mut tc = free;
                loop {
                    let (via_jc, pos) = parent_tc[tc as usize];
                    add_flow(&mut flow, &mut users, via_jc, pos, tc);
                    let (prev_tc, prev_pos) = parent_jc[via_jc as usize];
                    if prev_tc == u32::MAX {
                        break;
                    }
                    flow[via_jc as usize][prev_pos as usize] -= 1;
                    tc = prev_tc;
                }
            }
        }
    }
    // Re-derive per-job classes from the final flows: earlier jobs may have been moved by
    // later augmentations, but any decomposition of the flow is a valid assignment.
    // Flows are only taken from here on: the first position with flow left only moves on.
    let mut remaining = flow;
    let mut first_flow = vec![0usize; n_job_classes];
    let mut out = vec![None; job_classes.len()];
    for (j, &jc) in job_classes.iter().enumerate() {
        if !matched[j] {
            continue;
        }
        let row = &mut remaining[jc as usize];
        let start = &mut first_flow[jc as usize];
        let k = *start
            + row[*start..]
                .iter()
                .position(|&f| f > 0)
                .expect("a matched job has flow in its class");
        *start = k;
        row[k] -= 1;
        out[j] = Some(graph.compat[jc as usize][k]);
    }
    out
}

fn add_flow(flow: &mut [Vec<u32>], users: &mut [Vec<(u32, u32)>], jc: u32, pos: u32, tc: u32) {
    let f = &mut flow[jc as usize][pos as usize];
    if *f == 0 && !users[tc as usize].contains(&(jc, pos)) {
        users[tc as usize].push((jc, pos));
    }
    *f += 1;
}

/// The original's matching on single jobs and TPUs (Kuhn, in job order; each job tries
/// unvisited compatible TPUs preferring unmatched ones, then in list order; a held TPU is
/// taken only if its job can move). Quadratic: a test oracle and a reference.
pub fn kuhn_reference(compat: &[Vec<usize>], n_tpus: usize) -> Vec<Option<usize>> {
    let mut owner: Vec<Option<usize>> = vec![None; n_tpus];
    let mut matched: Vec<Option<usize>> = vec![None; compat.len()];
    for j in 0..compat.len() {
        let mut visited = vec![false; n_tpus];
        try_kuhn(j, compat, &mut owner, &mut matched, &mut visited);
    }
    matched
}

fn try_kuhn(
    j: usize,
    compat: &[Vec<usize>],
    owner: &mut [Option<usize>],
    matched: &mut [Option<usize>],
    visited: &mut [bool],
) -> bool {
    let mut order: Vec<usize> = compat[j].iter().copied().filter(|&t| !visited[t]).collect();
    order.sort_by_key(|&t| owner[t].is_some());
    for t in order {
        if visited[t] {
            continue;
        }
        visited[t] = true;
        let can_take = match owner[t] {
            None => true,
            Some(other) => try_kuhn(other, compat, owner, matched, visited),
        };
        if can_take {
            owner[t] = Some(j);
            matched[j] = Some(t);
            return true;
        }
    }
    false
}

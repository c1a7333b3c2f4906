//! The comparison policies: `least_request`, `prefix_only`, `random`
//! (`round_robin` is a rotation, see `rank`).

use super::{Ranked, WorkerView};
use rand::{SeedableRng, seq::SliceRandom};

/// Fewest requests first (our in-flight count or the engine's queue).
pub(super) fn least_request(
    c: &mut [Ranked],
    views: &[WorkerView],
    tie: impl Fn(&Ranked) -> usize,
) {
    c.sort_by(|a, b| {
        views[a.index]
            .load()
            .total_cmp(&views[b.index].load())
            .then_with(|| tie(a).cmp(&tie(b)))
    });
}

/// Longest cached prefix first, ties by load.
pub(super) fn prefix_only(c: &mut [Ranked], views: &[WorkerView], tie: impl Fn(&Ranked) -> usize) {
    c.sort_by(|a, b| {
        let (va, vb) = (&views[a.index], &views[b.index]);
        vb.matched_tokens()
            .cmp(&va.matched_tokens())
            .then_with(|| va.load().total_cmp(&vb.load()))
            .then_with(|| tie(a).cmp(&tie(b)))
    });
}

pub(super) fn shuffle(c: &mut [Ranked], seed: u64) {
    c.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(seed));
}

#[cfg(test)]
mod tests {
    use crate::config::{Policy, ScoringConfig};
    use crate::scoring::{PromptTokens, Rotation, ScrapedLoad, WorkerView, rank_views};

    fn view(matched: u32, in_flight: u32) -> WorkerView {
        WorkerView {
            up: true,
            gpu_hit_tokens: matched,
            in_flight,
            prefill_rate: 1000.0,
            ..Default::default()
        }
    }

    fn first(policy: Policy, views: &[WorkerView]) -> usize {
        let t = Rotation {
            counter: 0,
            random: 0,
        };
        rank_views(
            policy,
            &ScoringConfig::default(),
            PromptTokens::unseen(4096),
            views,
            t,
        )[0]
        .index
    }

    #[test]
    fn least_request_takes_the_emptiest() {
        let views = [view(4096, 3), view(0, 1), view(0, 2)];
        assert_eq!(first(Policy::LeastRequest, &views), 1);
    }

    #[test]
    fn least_request_counts_the_scraped_queue() {
        let mut views = [view(0, 1), view(0, 0)];
        views[1].scraped = Some(ScrapedLoad {
            waiting: 4.0,
            running: 2.0,
            kv_usage: 0.5,
            ..ScrapedLoad::default()
        });
        assert_eq!(first(Policy::LeastRequest, &views), 0);
    }

    #[test]
    fn prefix_only_takes_the_longest_match_then_the_emptiest() {
        let views = [view(64, 0), view(2048, 9), view(2048, 4)];
        assert_eq!(first(Policy::PrefixOnly, &views), 2);
        let mut views = [view(64, 0), view(0, 0)];
        views[1].cpu_hit_tokens = 128;
        assert_eq!(first(Policy::PrefixOnly, &views), 1);
    }
}

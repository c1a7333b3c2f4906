//! Workloads: when requests arrive and what their prompts are.
//!
//! A [`Plan`] is built once per workload × rate from the seed and shared by
//! every policy, so all policies see the same arrivals. Prompts are token ids
//! generated on demand ([`super::tokens`]); multi-turn sessions are closed
//! loops: a turn's prompt is the previous prompt, the tokens the engine
//! generated, and the new user message, sent after a think time.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::tokens::{Stream, extend};
use super::trace::TraceRequest;

/// The four synthetic workloads and trace replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    SharedPrefix,
    MultiTurn,
    Independent,
    Mixed,
    Trace,
}

/// Workload sizes (the `--groups …` flags, resolved per workload).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Sizes {
    pub groups: u32,
    pub users_per_group: u32,
    pub prefix_tokens: u32,
    pub question_tokens: u32,
    pub output_tokens: u32,
    /// Multi-turn: mean think time between turns (s).
    pub think_s: f64,
    /// Multi-turn: a session ends once its context passes this many tokens.
    pub max_context_tokens: u32,
}

/// Who sent a request (a label in the results of `mixed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tenant {
    Chat,
    Rag,
    Agent,
    Trace,
}

impl Tenant {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Rag => "rag",
            Self::Agent => "agent",
            Self::Trace => "trace",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptSpec {
    /// Group prefix + the user's question.
    Shared {
        group: u32,
        user: u32,
        prefix: u32,
        question: u32,
    },
    /// `len` tokens nobody shares.
    Unique { key: u64, len: u32 },
    /// A trace line: its blocks' tokens, then unique padding.
    Trace {
        index: u64,
        hash_ids: Vec<u64>,
        len: u32,
    },
}

impl PromptSpec {
    /// The shared-prefix group of a chat prompt.
    pub fn group(&self) -> Option<u32> {
        match self {
            Self::Shared { group, .. } => Some(*group),
            Self::Unique { .. } | Self::Trace { .. } => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum What {
    Single {
        prompt: PromptSpec,
        output: u32,
    },
    /// Index into [`Plan::sessions`].
    Session(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    pub t: f64,
    pub tenant: Tenant,
    pub what: What,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TurnPlan {
    pub user_tokens: u32,
    pub output: u32,
    /// Pause after the previous answer before this turn is sent (s).
    pub think_s: f64,
}

/// A coding session: a system prompt shared by its agent kind, a unique
/// repository context, then turns until the context is large.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPlan {
    pub key: u64,
    pub system_group: u32,
    pub system_tokens: u32,
    pub context_tokens: u32,
    pub turns: Vec<TurnPlan>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub seed: u64,
    pub arrivals: Vec<Arrival>,
    pub sessions: Vec<SessionPlan>,
    /// No turn starts after this (s).
    pub end_s: f64,
    pub max_context_tokens: u32,
}

/// Multi-turn shape (means of uniform draws), besides the [`Sizes`] flags.
/// Repository context of a session, in user messages (× question tokens).
const AGENT_CONTEXT_MESSAGES: (f64, f64) = (2.5, 10.0);
const AGENT_OUTPUT_RANGE: (f64, f64) = (0.5, 1.5);
const AGENT_USER_RANGE: (f64, f64) = (0.3, 1.7);
/// Mixed: share of the request rate per tenant (chat, rag, agent).
const MIXED_SHARES: [f64; 3] = [0.4, 0.3, 0.3];
/// Mixed: the RAG tenant's prompt and output lengths.
const RAG_PROMPT_TOKENS: u32 = 4_000;
const RAG_OUTPUT_TOKENS: u32 = 200;

// === impl Plan ===

impl Plan {
    /// The plan of a synthetic workload (not `trace`, see [`Plan::from_trace`]).
    pub fn synthetic(
        kind: WorkloadKind,
        sizes: &Sizes,
        rate_per_min: f64,
        duration_s: f64,
        seed: u64,
    ) -> Plan {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_0001);
        let mut plan = Plan {
            seed,
            arrivals: Vec::new(),
            sessions: Vec::new(),
            end_s: duration_s,
            max_context_tokens: sizes.max_context_tokens,
        };
        match kind {
            WorkloadKind::SharedPrefix => plan.add_chat(&mut rng, sizes, rate_per_min, duration_s),
            WorkloadKind::Independent => {
                let len = sizes.prefix_tokens + sizes.question_tokens;
                plan.add_unique(
                    &mut rng,
                    Tenant::Rag,
                    len,
                    sizes.output_tokens,
                    rate_per_min,
                    duration_s,
                );
            }
            WorkloadKind::MultiTurn => plan.add_agents(&mut rng, sizes, rate_per_min, duration_s),
            WorkloadKind::Mixed => {
                let [chat, rag, agent] = MIXED_SHARES.map(|s| s * rate_per_min);
                plan.add_chat(&mut rng, sizes, chat, duration_s);
                plan.add_unique(
                    &mut rng,
                    Tenant::Rag,
                    RAG_PROMPT_TOKENS,
                    RAG_OUTPUT_TOKENS,
                    rag,
                    duration_s,
                );
                plan.add_agents(&mut rng, sizes, agent, duration_s);
            }
            WorkloadKind::Trace => {}
        }
        plan.arrivals.sort_by(|a, b| a.t.total_cmp(&b.t));
        plan
    }

    /// Replays trace lines; timestamps are scaled so the mean rate is
    /// `rate_per_min`, and lines past `duration_s` are dropped.
    pub fn from_trace(
        trace: &[TraceRequest],
        rate_per_min: f64,
        duration_s: f64,
        seed: u64,
    ) -> Plan {
        let first = trace.iter().map(|r| r.timestamp_ms).min().unwrap_or(0);
        let last = trace.iter().map(|r| r.timestamp_ms).max().unwrap_or(0);
        let span_s = ((last - first) as f64 / 1000.0).max(1e-3);
        let natural_per_min = trace.len() as f64 / span_s * 60.0;
        let scale = if rate_per_min > 0.0 {
            natural_per_min / rate_per_min
        } else {
            1.0
        };
        let mut arrivals: Vec<Arrival> = trace
            .iter()
            .enumerate()
            .map(|(i, r)| Arrival {
                t: (r.timestamp_ms - first) as f64 / 1000.0 * scale,
                tenant: Tenant::Trace,
                what: What::Single {
                    prompt: PromptSpec::Trace {
                        index: i as u64,
                        hash_ids: r.hash_ids.clone(),
                        len: r.input_length,
                    },
                    output: r.output_length.max(1),
                },
            })
            .filter(|a| a.t <= duration_s)
            .collect();
        arrivals.sort_by(|a, b| a.t.total_cmp(&b.t));
        Plan {
            seed,
            arrivals,
            sessions: Vec::new(),
            end_s: duration_s,
            max_context_tokens: u32::MAX,
        }
    }

    /// Shared-prefix chat: the `groups × users` prompts in a seeded order,
    /// cycled (a GuideLLM-style synthetic dataset consumed in order).
    fn add_chat(&mut self, rng: &mut ChaCha8Rng, s: &Sizes, rate: f64, duration_s: f64) {
        let mut order: Vec<(u32, u32)> = (0..s.groups.max(1))
            .flat_map(|g| (0..s.users_per_group.max(1)).map(move |u| (g, u)))
            .collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        for (i, t) in poisson(rng, rate, duration_s).into_iter().enumerate() {
            let (group, user) = order[i % order.len()];
            self.arrivals.push(Arrival {
                t,
                tenant: Tenant::Chat,
                what: What::Single {
                    prompt: PromptSpec::Shared {
                        group,
                        user,
                        prefix: s.prefix_tokens,
                        question: s.question_tokens,
                    },
                    output: s.output_tokens,
                },
            });
        }
    }

    fn add_unique(
        &mut self,
        rng: &mut ChaCha8Rng,
        tenant: Tenant,
        len: u32,
        output: u32,
        rate: f64,
        duration_s: f64,
    ) {
        let base = self.arrivals.len() as u64;
        for (i, t) in poisson(rng, rate, duration_s).into_iter().enumerate() {
            self.arrivals.push(Arrival {
                t,
                tenant,
                what: What::Single {
                    prompt: PromptSpec::Unique {
                        key: base + i as u64,
                        len,
                    },
                    output,
                },
            });
        }
    }

    /// Coding sessions arriving so that their turns add up to `rate` requests/min.
    fn add_agents(&mut self, rng: &mut ChaCha8Rng, s: &Sizes, rate: f64, duration_s: f64) {
        // Mean turns per session, from sample plans on a separate stream.
        let mut probe = ChaCha8Rng::seed_from_u64(rng.random());
        let mean_turns = (0..256)
            .map(|k| session(&mut probe, s, k).turns.len())
            .sum::<usize>() as f64
            / 256.0;
        let session_rate = rate / mean_turns.max(1.0);
        for t in poisson(rng, session_rate, duration_s) {
            let key = self.sessions.len() as u64;
            self.sessions.push(session(rng, s, key));
            self.arrivals.push(Arrival {
                t,
                tenant: Tenant::Agent,
                what: What::Session(key as usize),
            });
        }
    }

    /// The token ids of a single request's prompt.
    pub fn prompt(&self, spec: &PromptSpec) -> Vec<u32> {
        let mut out = Vec::new();
        match *spec {
            PromptSpec::Shared {
                group,
                user,
                prefix,
                question,
            } => {
                out.reserve((prefix + question) as usize);
                extend(
                    &mut out,
                    self.seed,
                    Stream::Prefix(group.into(), 0),
                    0,
                    prefix.into(),
                );
                extend(
                    &mut out,
                    self.seed,
                    Stream::Question(group.into(), user.into()),
                    0,
                    question.into(),
                );
            }
            PromptSpec::Unique { key, len } => {
                extend(&mut out, self.seed, Stream::Unique(key, 0), 0, len.into());
            }
            PromptSpec::Trace {
                index,
                ref hash_ids,
                len,
            } => {
                out.reserve(len as usize);
                for &h in hash_ids {
                    if out.len() >= len as usize {
                        break;
                    }
                    extend(
                        &mut out,
                        self.seed,
                        Stream::TraceBlock(h),
                        0,
                        super::trace::BLOCK_TOKENS.into(),
                    );
                }
                out.truncate(len as usize);
                let missing = len as u64 - out.len() as u64;
                extend(
                    &mut out,
                    self.seed,
                    Stream::Unique(u64::MAX - index, 1),
                    0,
                    missing,
                );
            }
        }
        out
    }

    /// The first prompt of a session: system prompt + repository context.
    pub fn session_start(&self, s: &SessionPlan) -> Vec<u32> {
        let mut out = Vec::with_capacity((s.system_tokens + s.context_tokens) as usize);
        extend(
            &mut out,
            self.seed,
            Stream::Prefix(s.system_group.into(), 1),
            0,
            s.system_tokens.into(),
        );
        extend(
            &mut out,
            self.seed,
            Stream::Unique(s.key, 1),
            0,
            s.context_tokens.into(),
        );
        out
    }

    /// Appends turn `turn`'s user message to a session's context.
    pub fn user_message(&self, s: &SessionPlan, turn: usize, context: &mut Vec<u32>) {
        let len = s.turns[turn].user_tokens;
        extend(
            context,
            self.seed,
            Stream::Unique(s.key, 2 + turn as u64),
            0,
            len.into(),
        );
    }
}

fn session(rng: &mut ChaCha8Rng, s: &Sizes, key: u64) -> SessionPlan {
    let context_tokens = (f64::from(s.question_tokens)
        * rng.random_range(AGENT_CONTEXT_MESSAGES.0..AGENT_CONTEXT_MESSAGES.1))
    .round() as u32;
    let mut total = u64::from(s.prefix_tokens + context_tokens);
    let mut turns = Vec::new();
    let limit = u64::from(s.max_context_tokens);
    while total < limit || turns.is_empty() {
        let user = (f64::from(s.question_tokens)
            * rng.random_range(AGENT_USER_RANGE.0..AGENT_USER_RANGE.1))
        .round() as u32;
        let output = (f64::from(s.output_tokens)
            * rng.random_range(AGENT_OUTPUT_RANGE.0..AGENT_OUTPUT_RANGE.1))
        .round() as u32;
        let think_s = if turns.is_empty() {
            0.0
        } else {
            exp(rng, s.think_s)
        };
        turns.push(TurnPlan {
            user_tokens: user.max(1),
            output: output.max(1),
            think_s,
        });
        total += u64::from(user.max(1) + output.max(1));
    }
    SessionPlan {
        key,
        system_group: rng.random_range(0..s.groups.max(1)),
        system_tokens: s.prefix_tokens,
        context_tokens,
        turns,
    }
}

/// Exponential draw with the given mean.
fn exp(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -mean * u.ln()
}

/// Poisson arrival times at `rate_per_min` over `[0, duration_s)`.
fn poisson(rng: &mut ChaCha8Rng, rate_per_min: f64, duration_s: f64) -> Vec<f64> {
    let mut out = Vec::new();
    if rate_per_min.is_nan() || rate_per_min <= 0.0 || duration_s.is_nan() || duration_s <= 0.0 {
        return out;
    }
    let mean_gap = 60.0 / rate_per_min;
    let mut t = exp(rng, mean_gap);
    while t < duration_s {
        out.push(t);
        t += exp(rng, mean_gap);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sizes() -> Sizes {
        Sizes {
            groups: 3,
            users_per_group: 2,
            prefix_tokens: 64,
            question_tokens: 32,
            output_tokens: 8,
            think_s: 2.0,
            max_context_tokens: 400,
        }
    }

    #[test]
    fn poisson_rate_is_about_right_and_seeded() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let n = poisson(&mut rng, 600.0, 100.0).len();
        assert!((900..1100).contains(&n), "{n}");
        let a = Plan::synthetic(WorkloadKind::Mixed, &sizes(), 60.0, 60.0, 9);
        let b = Plan::synthetic(WorkloadKind::Mixed, &sizes(), 60.0, 60.0, 9);
        let c = Plan::synthetic(WorkloadKind::Mixed, &sizes(), 60.0, 60.0, 10);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.arrivals.windows(2).all(|w| w[0].t <= w[1].t));
    }

    #[test]
    fn shared_prefix_prompts_share_exactly_the_group_prefix() {
        let plan = Plan::synthetic(WorkloadKind::SharedPrefix, &sizes(), 600.0, 60.0, 1);
        let spec = |g, u| PromptSpec::Shared {
            group: g,
            user: u,
            prefix: 64,
            question: 32,
        };
        let (a, b, c) = (
            plan.prompt(&spec(0, 0)),
            plan.prompt(&spec(0, 1)),
            plan.prompt(&spec(1, 0)),
        );
        assert_eq!(a.len(), 96);
        assert_eq!(a[..64], b[..64]);
        assert_ne!(a[64..], b[64..]);
        assert_ne!(a[..16], c[..16]);
        // Every (group, user) prompt appears before any repeats.
        let firsts: std::collections::HashSet<_> = plan.arrivals[..6]
            .iter()
            .map(|a| match &a.what {
                What::Single {
                    prompt: PromptSpec::Shared { group, user, .. },
                    ..
                } => (*group, *user),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(firsts.len(), 6);
    }

    #[test]
    fn trace_replay_scales_time_and_shares_blocks() {
        let line = |ts: u64, hash_ids: Vec<u64>| TraceRequest {
            timestamp_ms: ts,
            input_length: 700,
            output_length: 3,
            hash_ids,
        };
        let trace = [
            line(0, vec![1, 2]),
            line(30_000, vec![1, 3]),
            line(60_000, vec![9]),
        ];
        // 3 lines over 60 s = 3/min natural; at 6/min time is halved.
        let plan = Plan::from_trace(&trace, 6.0, 1_000.0, 1);
        let ts: Vec<f64> = plan.arrivals.iter().map(|a| a.t).collect();
        assert_eq!(ts, vec![0.0, 15.0, 30.0]);
        let prompts: Vec<Vec<u32>> = plan
            .arrivals
            .iter()
            .map(|a| match &a.what {
                What::Single { prompt, .. } => plan.prompt(prompt),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(prompts.iter().all(|p| p.len() == 700));
        assert_eq!(prompts[0][..512], prompts[1][..512]);
        assert_ne!(prompts[0][512..], prompts[1][512..]);
        assert_ne!(prompts[0][..512], prompts[2][..512]);
        assert_eq!(Plan::from_trace(&trace, 6.0, 20.0, 1).arrivals.len(), 2);
    }

    #[test]
    fn sessions_grow_to_the_context_limit() {
        let plan = Plan::synthetic(WorkloadKind::MultiTurn, &sizes(), 60.0, 600.0, 3);
        assert!(!plan.sessions.is_empty());
        for s in &plan.sessions {
            let total: u32 = s.system_tokens
                + s.context_tokens
                + s.turns
                    .iter()
                    .map(|t| t.user_tokens + t.output)
                    .sum::<u32>();
            assert!(total >= 400 && !s.turns.is_empty());
            assert_eq!(s.turns[0].think_s, 0.0);
        }
        let s = &plan.sessions[0];
        let mut ctx = plan.session_start(s);
        let start = ctx.clone();
        plan.user_message(s, 0, &mut ctx);
        assert_eq!(ctx[..start.len()], start[..]);
        assert_eq!(ctx.len(), start.len() + s.turns[0].user_tokens as usize);
    }
}

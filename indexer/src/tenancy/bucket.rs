//! Token buckets of one budget, free of I/O: the same arithmetic runs in
//! memory here and in Redis (`store::REDIS_ADMIT`), so that both backends
//! admit the same requests.
//!
//! Tokens and requests refill continuously at their per-minute limit, up to
//! one minute's worth (a burst of a full minute is allowed, nothing more).
//! An admission takes its whole cost or nothing. Settling a request gives
//! back what it reserved but did not use, or takes the excess (the bucket
//! may go below zero: the debt delays the next admission).

use super::policy::Budget;

const MINUTE_MS: f64 = 60_000.0;

/// The state of one budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Buckets {
    pub tokens: f64,
    pub requests: f64,
    pub updated_ms: u64,
    pub in_flight: u32,
}

/// The limit that refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Tokens,
    Requests,
    Concurrency,
    /// The request alone needs more than a minute of tokens.
    TooLarge,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Admitted; the tokens left after it (`None`: no token limit).
    Admit {
        tokens_left: Option<f64>,
    },
    Reject {
        limit: Limit,
        retry_after_ms: u64,
    },
}

// === impl Limit ===

impl Limit {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::Requests => "requests",
            Self::Concurrency => "concurrency",
            Self::TooLarge => "too_large",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "tokens" => Self::Tokens,
            "requests" => Self::Requests,
            "concurrency" => Self::Concurrency,
            "too_large" => Self::TooLarge,
            _ => return None,
        })
    }
}

// === impl Buckets ===

impl Buckets {
    /// A budget nobody used yet: full.
    pub fn full(b: &Budget, now_ms: u64) -> Self {
        Self {
            tokens: b.tokens_per_minute.unwrap_or(0) as f64,
            requests: b.requests_per_minute.unwrap_or(0) as f64,
            updated_ms: now_ms,
            in_flight: 0,
        }
    }

    fn refill(&mut self, b: &Budget, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.updated_ms) as f64;
        if let Some(tpm) = b.tokens_per_minute {
            let tpm = tpm as f64;
            self.tokens = (self.tokens + elapsed * tpm / MINUTE_MS).min(tpm);
        }
        if let Some(rpm) = b.requests_per_minute {
            let rpm = rpm as f64;
            self.requests = (self.requests + elapsed * rpm / MINUTE_MS).min(rpm);
        }
        self.updated_ms = self.updated_ms.max(now_ms);
    }

    /// Takes `cost` tokens, one request and one concurrency slot, or
    /// nothing. The longest wait among the refusing limits is the retry.
    pub fn admit(&mut self, b: &Budget, cost: u64, now_ms: u64) -> Verdict {
        self.refill(b, now_ms);
        if let Some(tpm) = b.tokens_per_minute
            && cost > tpm
        {
            return Verdict::Reject {
                limit: Limit::TooLarge,
                retry_after_ms: 0,
            };
        }
        let mut refused: Option<(Limit, u64)> = None;
        let mut refuse = |limit, wait: u64| {
            if refused.is_none_or(|(_, w)| wait > w) {
                refused = Some((limit, wait));
            }
        };
        if let Some(tpm) = b.tokens_per_minute
            && self.tokens < cost as f64
        {
            refuse(Limit::Tokens, wait_ms(cost as f64 - self.tokens, tpm));
        }
        if let Some(rpm) = b.requests_per_minute
            && self.requests < 1.0
        {
            refuse(Limit::Requests, wait_ms(1.0 - self.requests, rpm));
        }
        if let Some(max) = b.max_concurrent
            && self.in_flight >= max
        {
            // Nothing tells when one ends; a second is a polite guess.
            refuse(Limit::Concurrency, 1_000);
        }
        if let Some((limit, retry_after_ms)) = refused {
            return Verdict::Reject {
                limit,
                retry_after_ms,
            };
        }
        if b.tokens_per_minute.is_some() {
            self.tokens -= cost as f64;
        }
        if b.requests_per_minute.is_some() {
            self.requests -= 1.0;
        }
        self.in_flight += 1;
        Verdict::Admit {
            tokens_left: b.tokens_per_minute.map(|_| self.tokens),
        }
    }

    /// A request ended: `refund` tokens come back (negative: taken), and
    /// its concurrency slot is freed.
    pub fn settle(&mut self, b: &Budget, refund: f64, now_ms: u64) {
        self.refill(b, now_ms);
        if let Some(tpm) = b.tokens_per_minute {
            self.tokens = (self.tokens + refund).min(tpm as f64);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Nothing in flight and refilled to full: the same as no state at all.
    pub fn idle(&self, b: &Budget, now_ms: u64) -> bool {
        let mut copy = *self;
        copy.refill(b, now_ms);
        copy.in_flight == 0
            && copy
                == Self {
                    updated_ms: copy.updated_ms,
                    ..Self::full(b, now_ms)
                }
    }
}

fn wait_ms(missing: f64, per_minute: u64) -> u64 {
    (missing * MINUTE_MS / per_minute as f64).ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tpm: Option<u64>, rpm: Option<u64>, conc: Option<u32>) -> Budget {
        Budget {
            tokens_per_minute: tpm,
            requests_per_minute: rpm,
            max_concurrent: conc,
        }
    }

    #[test]
    fn tokens_are_taken_whole_and_refill_per_minute() {
        let b = budget(Some(600), None, None);
        let mut s = Buckets::full(&b, 0);
        assert_eq!(
            s.admit(&b, 500, 0),
            Verdict::Admit {
                tokens_left: Some(100.0)
            }
        );
        // 200 needed, 100 there: 100 more take 10 s at 10 tokens/s.
        assert_eq!(
            s.admit(&b, 200, 0),
            Verdict::Reject {
                limit: Limit::Tokens,
                retry_after_ms: 10_000
            }
        );
        assert!(matches!(s.admit(&b, 200, 10_000), Verdict::Admit { .. }));
        // Never more than a minute's worth.
        let mut s = Buckets::full(&b, 0);
        s.refill(&b, 3_600_000);
        assert_eq!(s.tokens, 600.0);
    }

    #[test]
    fn a_request_larger_than_the_minute_is_refused_for_good() {
        let b = budget(Some(100), None, None);
        let mut s = Buckets::full(&b, 0);
        assert_eq!(
            s.admit(&b, 101, 0),
            Verdict::Reject {
                limit: Limit::TooLarge,
                retry_after_ms: 0
            }
        );
        assert_eq!(s.tokens, 100.0);
    }

    #[test]
    fn settling_refunds_or_charges_and_frees_the_slot() {
        let b = budget(Some(1_000), None, Some(1));
        let mut s = Buckets::full(&b, 0);
        assert!(matches!(s.admit(&b, 800, 0), Verdict::Admit { .. }));
        assert!(matches!(
            s.admit(&b, 10, 0),
            Verdict::Reject {
                limit: Limit::Concurrency,
                ..
            }
        ));
        // Used 300 of the 800 reserved.
        s.settle(&b, 500.0, 0);
        assert_eq!((s.tokens, s.in_flight), (700.0, 0));
        // Used 400 more than reserved: a debt.
        assert!(matches!(s.admit(&b, 700, 0), Verdict::Admit { .. }));
        s.settle(&b, -400.0, 0);
        assert_eq!(s.tokens, -400.0);
        assert!(matches!(
            s.admit(&b, 1, 0),
            Verdict::Reject {
                limit: Limit::Tokens,
                retry_after_ms: 24_060
            }
        ));
        assert!(!s.idle(&b, 0));
        assert!(s.idle(&b, 84_000));
    }

    #[test]
    fn the_longest_wait_names_the_limit() {
        let b = budget(Some(60), Some(1), None);
        let mut s = Buckets::full(&b, 0);
        assert!(matches!(s.admit(&b, 10, 0), Verdict::Admit { .. }));
        // Tokens: 50 left, fine; requests: 0 left, 60 s to the next.
        assert_eq!(
            s.admit(&b, 10, 0),
            Verdict::Reject {
                limit: Limit::Requests,
                retry_after_ms: 60_000
            }
        );
    }

    #[test]
    fn no_limits_admit_everything() {
        let b = Budget::default();
        let mut s = Buckets::full(&b, 0);
        for _ in 0..1000 {
            assert_eq!(
                s.admit(&b, 1 << 40, 0),
                Verdict::Admit { tokens_left: None }
            );
        }
    }
}

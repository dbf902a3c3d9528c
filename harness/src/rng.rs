//! The one pseudo-random generator of the tests: xorshift64 (Marsaglia's 13/7/17), fixed seeds,
//! so a generated case is the same on every run and a failure reproduces from its number.

/// A xorshift64 state; the seed must not be 0.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        assert_ne!(seed, 0, "xorshift never leaves 0");
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_xorshift64_13_7_17() {
        let mut r = Rng::new(1);
        assert_eq!(r.next_u64(), 1082269761);
        assert_eq!(r.next_u64(), 1152992998833853505);
    }
}

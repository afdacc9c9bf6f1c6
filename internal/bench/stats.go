package bench

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of samples by the
// nearest-rank method: the smallest sample with at least p% of the samples
// at or below it. Nearest rank never invents a value nobody measured, which
// matters for tails drawn from a few hundred samples. It returns 0 for no
// samples. samples is not modified.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return percentileSorted(sorted, p)
}

func percentileSorted(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	p = min(max(p, 0), 100)
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Summary describes a set of latency samples.
type Summary struct {
	N                        int
	Mean, P50, P95, P99, Max time.Duration
}

// Summarize computes a Summary of samples (not modified).
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var sum time.Duration
	for _, s := range sorted {
		sum += s
	}
	return Summary{
		N:    len(sorted),
		Mean: sum / time.Duration(len(sorted)),
		P50:  percentileSorted(sorted, 50),
		P95:  percentileSorted(sorted, 95),
		P99:  percentileSorted(sorted, 99),
		Max:  sorted[len(sorted)-1],
	}
}

// rate is count per second over d; 0 when d is not positive.
func rate(count int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(count) / d.Seconds()
}

// ratio is a/b, or 0 when b is 0 (no claims: no conflicts per claim).
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

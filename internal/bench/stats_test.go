package bench

import (
	"slices"
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentileNearestRank(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(100-i) * time.Millisecond // 100..1, unsorted
	}
	cases := []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one sample is every percentile", ms(7), 99, 7 * time.Millisecond},
		{"one sample p0", ms(7), 0, 7 * time.Millisecond},
		{"median of odd count", ms(5, 1, 3), 50, 3 * time.Millisecond},
		{"median of even count takes the lower middle", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p100 is the max", ms(4, 9, 1), 100, 9 * time.Millisecond},
		{"above 100 clamps to the max", ms(4, 9, 1), 150, 9 * time.Millisecond},
		{"p99 of 1..100", hundred, 99, 99 * time.Millisecond},
		{"p95 of 1..100", hundred, 95, 95 * time.Millisecond},
		{"p99.5 of 1..100 rounds up", hundred, 99.5, 100 * time.Millisecond},
		{"p1 of 1..100", hundred, 1, 1 * time.Millisecond},
		// With 10 samples p99 needs rank ceil(9.9) = 10: the max, never an
		// interpolated value below it.
		{"p99 of ten samples is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 500), 99, 500 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(c.samples)
			if got := Percentile(c.samples, c.p); got != c.want {
				t.Errorf("Percentile(%v, %g) = %v, want %v", c.samples, c.p, got, c.want)
			}
			if !slices.Equal(before, c.samples) {
				t.Errorf("Percentile reordered its input")
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	if got := Summarize(nil); got != (Summary{}) {
		t.Fatalf("Summarize(nil) = %+v, want zero", got)
	}
	got := Summarize(ms(30, 10, 20, 40))
	want := Summary{N: 4, Mean: 25 * time.Millisecond, P50: 20 * time.Millisecond, P95: 40 * time.Millisecond,
		P99: 40 * time.Millisecond, Max: 40 * time.Millisecond}
	if got != want {
		t.Fatalf("Summarize = %+v, want %+v", got, want)
	}
}

func TestRateAndRatio(t *testing.T) {
	if got := rate(500, 2*time.Second); got != 250 {
		t.Errorf("rate(500, 2s) = %g, want 250", got)
	}
	if got := rate(5, 0); got != 0 {
		t.Errorf("rate over no time = %g, want 0", got)
	}
	if got := ratio(3, 0); got != 0 {
		t.Errorf("ratio(3, 0) = %g, want 0", got)
	}
}

func TestSplitConcurrency(t *testing.T) {
	for _, c := range []struct {
		total, n int
		want     []int
	}{
		{16, 1, []int{16}},
		{16, 3, []int{6, 5, 5}},
		{4, 4, []int{1, 1, 1, 1}},
	} {
		if got := splitConcurrency(c.total, c.n); !slices.Equal(got, c.want) {
			t.Errorf("splitConcurrency(%d, %d) = %v, want %v", c.total, c.n, got, c.want)
		}
	}
}

func BenchmarkSummarize(b *testing.B) {
	samples := make([]time.Duration, 10_000)
	for i := range samples {
		samples[i] = time.Duration((i*7919)%10_000) * time.Microsecond
	}
	b.ReportAllocs()
	for b.Loop() {
		Summarize(samples)
	}
}

package worker

import (
	"maps"
	"testing"
	"time"

	"github.com/couchq/couchq/internal/protocol"
)

func TestSitesToAwait(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	at := func(ago time.Duration) float64 { return protocol.ToUnix(now.Add(-ago)) }
	sites := &protocol.SitesDoc{Default: "A", Sites: map[string]protocol.SiteInfo{
		"A": {}, "B": {}, "C": {},
		"D": {TakenOverBy: "B", TakenOverAt: at(30 * time.Minute)}, // gone since
		"E": {TakenOverBy: "B", TakenOverAt: at(2 * time.Hour)},    // came back since
	}}
	beats := func(a protocol.SiteHeartbeat) map[string]protocol.SiteHeartbeat {
		return map[string]protocol.SiteHeartbeat{
			"A": a,
			"B": {Rev: "7-b", At: at(time.Hour)}, // as this copy has it: maybe long ago
			"D": {Rev: "3-d", At: at(time.Hour)},
			"E": {Rev: "5-e", At: at(time.Hour)},
			// C never beat: no worker of it to hear from
		}
	}
	for _, tc := range []struct {
		name  string
		own   string
		sites *protocol.SitesDoc
		a     protocol.SiteHeartbeat
		want  map[string]string
	}{
		{"workers beat a moment ago", "A", sites, protocol.SiteHeartbeat{Rev: "9-a", At: at(25 * time.Second)}, nil},
		{"every worker stopped", "A", sites, protocol.SiteHeartbeat{Rev: "9-a", At: at(31 * time.Second)}, map[string]string{"B": "7-b", "E": "5-e"}},
		{"another worker waits already", "A", sites, protocol.SiteHeartbeat{Rev: "9-a", At: at(time.Second), CatchingUp: true}, map[string]string{"B": "7-b", "E": "5-e"}},
		{"a new site", "A", sites, protocol.SiteHeartbeat{}, nil},
		{"no site", "", sites, protocol.SiteHeartbeat{Rev: "9-a", At: at(time.Hour)}, nil},
		{"no sites document", "A", nil, protocol.SiteHeartbeat{Rev: "9-a", At: at(time.Hour)}, nil},
		{"no other site has workers", "A", &protocol.SitesDoc{Sites: map[string]protocol.SiteInfo{"A": {}, "C": {}}},
			protocol.SiteHeartbeat{Rev: "9-a", At: at(time.Hour)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := beats(tc.a)
			if tc.a.Rev == "" {
				delete(b, "A")
			}
			got, _ := sitesToAwait(tc.own, tc.sites, b, now, 10*time.Second)
			if !maps.Equal(got, tc.want) {
				t.Errorf("sitesToAwait = %v, want %v", got, tc.want)
			}
		})
	}
}

package protocol

import (
	"errors"
	"regexp"
	"strconv"
	"time"
)

// daysRE matches an age that starts with a number of days: 7d, 1.5d, 1d12h.
var daysRE = regexp.MustCompile(`^(\d+(?:\.\d+)?)d(.*)$`)

// ParseAge parses an age as operators write one: a Go duration (90s, 6h)
// or one that starts with days (7d, 1d12h), which Go's parser lacks.
// Negative ages are refused. couchq purge --older-than and the since and
// until of a stats report take it.
func ParseAge(s string) (time.Duration, error) {
	bad := errors.New("want a duration such as 90s, 6h or 7d")
	var days time.Duration
	rest := s
	if m := daysRE.FindStringSubmatch(s); m != nil {
		n, err := strconv.ParseFloat(m[1], 64)
		if err != nil || n > 100*365 {
			return 0, bad
		}
		days, rest = time.Duration(n*24*float64(time.Hour)), m[2]
		if rest == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(rest)
	if err != nil {
		return 0, bad
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return days + d, nil
}

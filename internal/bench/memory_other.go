//go:build !unix

package bench

import "errors"

func maxRSS() (uint64, error) {
	return 0, errors.New("peak RSS is measured on Unix systems only")
}

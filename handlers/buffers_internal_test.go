package handlers

import (
	"strings"
	"testing"
)

func TestHeadBufferKeepsStart(t *testing.T) {
	b := &headBuffer{limit: 5}
	for _, s := range []string{"ab", "cdef", "gh"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if string(b.buf) != "abcde" || !b.truncated() || b.total != 8 {
		t.Fatalf("buf %q truncated %v total %d", b.buf, b.truncated(), b.total)
	}
}

func TestTailBufferKeepsEnd(t *testing.T) {
	b := &tailBuffer{limit: 5}
	for _, s := range []string{"ab", "cdef", "gh"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if string(b.buf) != "defgh" || b.String() != "...defgh" {
		t.Fatalf("buf %q String %q", b.buf, b.String())
	}
	_, _ = b.Write([]byte(strings.Repeat("x", 10) + "yz"))
	if string(b.buf) != "xxxyz" {
		t.Fatalf("buf %q after a big write", b.buf)
	}
	small := &tailBuffer{limit: 100}
	_, _ = small.Write([]byte(" all of it \n"))
	if small.String() != "all of it" {
		t.Fatalf("String %q", small.String())
	}
}

func TestTailBufferDropsCutRune(t *testing.T) {
	b := &tailBuffer{limit: 3}
	_, _ = b.Write([]byte("aé€")) // é is 2 bytes, € 3: the tail is exactly "€"
	_, _ = b.Write([]byte("é"))   // now the tail starts inside €
	if got := b.String(); got != "...é" {
		t.Fatalf("String = %q", got)
	}
}

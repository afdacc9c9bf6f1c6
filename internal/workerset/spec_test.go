package workerset

import (
	"reflect"
	"testing"
)

func TestSplitWords(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][]string{
		`prog`:                       {"prog"},
		`  prog  a   b `:             {"prog", "a", "b"},
		`sh -c 'echo "$X" | wc -l'`:  {"sh", "-c", `echo "$X" | wc -l`},
		`a "b c" d`:                  {"a", "b c", "d"},
		`a "say \"hi\" \n" b`:        {"a", `say "hi" \n`, "b"},
		`a\ b c`:                     {"a b", "c"},
		`x'y'"z"`:                    {"xyz"},
		`a '' b`:                     {"a", "", "b"},
		"tab\tsep\nnewline":          {"tab", "sep", "newline"},
		`/path/to/my\ script.sh 'é'`: {"/path/to/my script.sh", "é"},
	} {
		got, err := SplitWords(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("SplitWords(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{``, `   `, `a 'b`, `a "b`, `a\`} {
		if got, err := SplitWords(in); err == nil {
			t.Errorf("SplitWords(%q) = %q, want an error", in, got)
		}
	}
}

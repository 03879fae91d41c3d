package broker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/contract"
)

func execSecret(cmd string) contract.Secret {
	return contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{Exec: cmd}}
}

func TestResolveExec(t *testing.T) {
	child := ChildInfo{Name: "web-3", Parent: "web", Index: 3}
	v, err := Resolve(t.Context(), "TOKEN", execSecret(`printf '%s|%s|%s\n' "$VMFORK_NAME" "$VMFORK_PARENT" "$VMFORK_INDEX"`), child, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(v), "web-3|web|3"; got != want {
		t.Errorf("value %q, want %q (one trailing newline dropped)", got, want)
	}
}

// secretBits is a value the errors below must never show.
const secretBits = "s3cr3t-bits"

func TestResolveErrorsNeverShowTheValue(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	os.WriteFile(big, []byte(secretBits+strings.Repeat("x", MaxValueBytes)), 0o600)
	twoLines := filepath.Join(dir, "two")
	os.WriteFile(twoLines, []byte(secretBits+"\nmore\n"), 0o600)
	for _, tc := range []struct {
		name string
		s    contract.Secret
		want []string // in the error
	}{
		{"exit", execSecret(`echo ` + secretBits + `; echo oops >&2; exit 3`),
			[]string{"secret TOKEN", "value_from.exec", "exit status 3", "oops"}},
		{"two newlines", execSecret(`printf '` + secretBits + `\n\n'`),
			[]string{"secret TOKEN", "value_from.exec", "control character"}},
		{"empty output", execSecret(`true`), []string{"value_from.exec", "empty"}},
		{"too large", execSecret(`head -c 20000 /dev/zero | tr '\0' x`), []string{"value_from.exec", "larger than"}},
		{"file too large", contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{File: big}},
			[]string{"value_from.file " + big, "larger than"}},
		{"file of two lines", contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{File: twoLines}},
			[]string{"value_from.file", "control character at byte 11"}},
		{"no file", contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{File: dir + "/none"}},
			[]string{"value_from.file", "no such file"}},
		{"env unset", contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{Env: "NOPE"}},
			[]string{"value_from.env NOPE", "$NOPE is empty or unset"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(t.Context(), "TOKEN", tc.s, ChildInfo{Name: "c"}, func(string) string { return "" })
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), secretBits) {
				t.Errorf("error %q shows the value", err)
			}
		})
	}
}

func TestResolveExecIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	// The hook leaves a child holding its stdout: the kill reaches it too.
	_, err := Resolve(ctx, "TOKEN", execSecret(`sleep 30 & sleep 30`), ChildInfo{Name: "c"}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want the deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Resolve took %v after its context ended", d)
	}
}

func TestResolveEnvAndFile(t *testing.T) {
	env := map[string]string{"API_TOKEN": "from-env\n"}
	v, err := Resolve(t.Context(), "TOKEN", contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{Env: "API_TOKEN"}},
		ChildInfo{Name: "c"}, func(k string) string { return env[k] })
	if err != nil || string(v) != "from-env" {
		t.Errorf("env: %q, %v; want from-env", v, err)
	}
	f := filepath.Join(t.TempDir(), "token")
	os.WriteFile(f, []byte("from-file\r\n"), 0o600)
	v, err = Resolve(t.Context(), "TOKEN", contract.Secret{Hosts: []string{apiHost}, ValueFrom: contract.ValueFrom{File: f}},
		ChildInfo{Name: "c"}, nil)
	if err != nil || string(v) != "from-file" {
		t.Errorf("file: %q, %v; want from-file", v, err)
	}
}

// RunHook gives the output as it is (a file's content keeps its newlines),
// bounded, with the child in the environment.
func TestRunHook(t *testing.T) {
	child := ChildInfo{Name: "web-2", Parent: "web", Index: 2}
	v, err := RunHook(t.Context(), `printf 'a\n%s %s %s\n\n' "$VMFORK_NAME" "$VMFORK_PARENT" "$VMFORK_INDEX"`, child, 64)
	if err != nil || string(v) != "a\nweb-2 web 2\n\n" {
		t.Errorf("RunHook = %q, %v; want the output as it is", v, err)
	}
	if _, err := RunHook(t.Context(), `printf 0123456789`, child, 9); !errors.Is(err, ErrNoValue) || !strings.Contains(err.Error(), "larger than 9 bytes") {
		t.Errorf("10 bytes of at most 9: %v", err)
	}
	if _, err := RunHook(t.Context(), `echo `+secretBits+`; exit 4`, child, 64); err == nil || strings.Contains(err.Error(), secretBits) {
		t.Errorf("a failing hook: %v, want an error without its output", err)
	}
}

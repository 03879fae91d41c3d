package customize

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Secret files (the contract's secret_files, package contract): secrets a
// guest holds in its own files, which a fork child must not keep of its
// parent's. Two steps of their own, so that the fork's JSON shows each:
// wipe deletes files, rotate writes the child's own value into others.
// Both go before vmfork.network, wipe first, so that the child reaches
// nothing with its parent's secrets.

// Names of the secret-files steps.
const (
	StepSecretFilesWipe   = "vmfork.secret-files.wipe"
	StepSecretFilesRotate = "vmfork.secret-files.rotate"
)

// MaxSecretFileBytes bounds one rotated file's value. Every value of a
// child travels in one guest command's environment (Part.Input), and
// Linux bounds one environment string to 128 KiB (MAX_ARG_STRLEN).
const MaxSecretFileBytes = 32 << 10

// maxRotateInput bounds the rotate part's whole input, for the same reason.
const maxRotateInput = 120 << 10

// rotateTimeout bounds the rotate step, its host commands included (the
// broker bounds each to 30 s).
const rotateTimeout = 2 * time.Minute

var (
	wipeScript   = guestScript("secret-files-wipe.sh")
	rotateScript = guestScript("secret-files-rotate.sh")
)

// SecretFilesWipeStep deletes files (absolute paths) in the child
// (scripts/secret-files-wipe.sh); one already absent is fine, and its
// detail says "N wiped, M absent". A path that is a directory fails it.
func SecretFilesWipeStep(files []string) Step {
	files = append([]string(nil), files...)
	return Step{Name: StepSecretFilesWipe, Timeout: DefaultTimeout, Parts: func(context.Context, *Env) ([]*Part, error) {
		for _, f := range files {
			if err := checkFilePath(f); err != nil {
				return nil, err
			}
		}
		return []*Part{{Script: wipeScript, Args: files}}, nil
	}}
}

// RotateValue returns file's new content in child: what its host command
// printed for that child. Its error names file and where the value comes
// from, never the value.
type RotateValue func(ctx context.Context, child Child, file string) ([]byte, error)

// SecretFilesRotateStep writes each of files (absolute paths), in the
// child, with its value for that child, at most MaxSecretFileBytes of
// anything but a NUL byte (scripts/secret-files-rotate.sh): mode 0600, the
// file's owner kept, replaced atomically (a temporary file in the same
// directory, renamed over it). A file the child lacks is created 0600,
// root's; the detail says which. The values are resolved on the host while
// the step is prepared, under its timeout, and go to the guest as the
// part's input, never on a command line.
func SecretFilesRotateStep(files []string, value RotateValue) Step {
	files = append([]string(nil), files...)
	return Step{Name: StepSecretFilesRotate, Timeout: rotateTimeout, Parts: func(ctx context.Context, env *Env) ([]*Part, error) {
		var in bytes.Buffer
		for _, f := range files {
			if err := checkFilePath(f); err != nil {
				return nil, err
			}
			v, err := value(ctx, env.Child, f)
			if err != nil {
				return nil, err
			}
			if err := checkFileValue(f, v); err != nil {
				return nil, err
			}
			fmt.Fprintf(&in, "%s F %s\n%s%s E\n", keyMark, f, v, keyMark)
		}
		if in.Len() > maxRotateInput {
			return nil, fmt.Errorf("the rotated files' values come to %d bytes, more than one guest command carries (%d)", in.Len(), maxRotateInput)
		}
		return []*Part{{Script: rotateScript, Input: in.Bytes()}}, nil
	}}
}

// checkFilePath refuses a path the scripts cannot take as one file
// (package contract refuses these already; a record written by hand may
// hold anything).
func checkFilePath(f string) error {
	if !strings.HasPrefix(f, "/") || f == "/" || strings.ContainsAny(f, "\n\x00") || strings.Contains(f, keyMark) {
		return fmt.Errorf("secret file %q: want an absolute path of a file, without a line break", f)
	}
	return nil
}

// errFileValue is a value that cannot travel to the guest; its error names
// the file, never the value.
var errFileValue = errors.New("cannot be written")

func checkFileValue(f string, v []byte) error {
	switch {
	case len(v) == 0:
		return fmt.Errorf("%s: the host command printed nothing: %w", f, errFileValue)
	case len(v) > MaxSecretFileBytes:
		return fmt.Errorf("%s: the value is larger than %d bytes: %w", f, MaxSecretFileBytes, errFileValue)
	case bytes.IndexByte(v, 0) >= 0:
		// The offset is not said: it tells something of the value.
		return fmt.Errorf("%s: the value holds a NUL byte, which a guest command's environment cannot carry: %w", f, errFileValue)
	case bytes.Contains(v, []byte(keyMark)):
		return fmt.Errorf("%s: the value holds %q, which frames the step's input: %w", f, keyMark, errFileValue)
	}
	return nil
}

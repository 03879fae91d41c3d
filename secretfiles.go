package vmfork

import (
	"context"
	"errors"
	"fmt"

	"github.com/vmfork/vmfork/broker"
	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/customize"
)

// Secret files (contract's secret_files): secrets a guest holds in its own
// files. A child's identity chain deletes those the contract wipes and
// writes its own value into those it rotates, each value the output of a
// host command run for that child at its identity time (as a brokered
// secret's exec hook: broker.RunHook, with VMFORK_NAME, VMFORK_PARENT and
// VMFORK_INDEX), before its NIC comes up. Only children's chains have the
// steps: the parent's files never change. A resumed machine keeps its
// identity (resumeChain skips every step but the agent's and the clock's),
// so its files stay as they are; a rewound one gets them again, as it gets
// a new identity. Nothing of the guest can be checked before a fork: the
// plan checks the contract's own fields (checkSecretFiles), and a child
// whose files cannot be wiped or rotated fails, with its step's error.

// secretFileSteps adds machine c's secret-files steps to its identity
// chain, before vmfork.network (after vmfork.connections where the chain
// has it): wipe, then rotate.
func secretFileSteps(chain customize.Chain, c *Machine) customize.Chain {
	var f *contract.SecretFiles
	if c.Contract != nil {
		f = c.Contract.SecretFiles
	}
	if f == nil {
		return chain
	}
	var steps []customize.Step
	if len(f.Wipe) > 0 {
		steps = append(steps, customize.SecretFilesWipeStep(f.Wipe))
	}
	if paths := f.RotatePaths(); len(paths) > 0 {
		hooks := make(map[string]string, len(paths))
		for _, p := range paths {
			hooks[p] = f.Rotate[p].Exec
		}
		steps = append(steps, customize.SecretFilesRotateStep(paths, rotateHook(hooks)))
	}
	return chain.InsertBefore(customize.StepNetwork, steps...)
}

// rotateHook resolves a rotated file's value for a child: its exec hook's
// output, as it is. A hook that fails fails the child with one line naming
// the file's hook by its field, and the hook's stderr: never its command or
// output, either of which may hold the value.
func rotateHook(hooks map[string]string) customize.RotateValue {
	return func(ctx context.Context, child customize.Child, file string) ([]byte, error) {
		info := broker.ChildInfo{Name: child.Name, Parent: child.Parent, Index: child.Index}
		v, err := broker.RunHook(ctx, hooks[file], info, customize.MaxSecretFileBytes)
		if err != nil {
			return nil, fmt.Errorf("secret_files.rotate.%s.exec: %w", file, err)
		}
		return v, nil
	}
}

// checkSecretFiles refuses, for a plan, secret files that no child could
// get: the contract's fields are checked again (a record's contract was
// never parsed), which is all the host can check before a fork.
func checkSecretFiles(c *contract.Contract) error {
	if c == nil || c.SecretFiles == nil {
		return nil
	}
	only := &contract.Contract{SecretFiles: c.Clone().SecretFiles}
	err := only.Validate()
	if ce := (*contract.Error)(nil); errors.As(err, &ce) {
		return fmt.Errorf("%s: %w", ce.Field, ce.Err) // without a second "contract:"
	}
	return err
}

// describeSecretFiles is the plan's words for f; "" for none.
func describeSecretFiles(f *contract.SecretFiles) string {
	if f == nil {
		return ""
	}
	switch w, r := len(f.Wipe), len(f.Rotate); {
	case w > 0 && r > 0:
		return fmt.Sprintf("in each child, before its NIC comes up, %d file(s) wiped and %d rotated (a host command's output for that child)", w, r)
	case w > 0:
		return fmt.Sprintf("in each child, before its NIC comes up, %d file(s) wiped", w)
	case r > 0:
		return fmt.Sprintf("in each child, before its NIC comes up, %d file(s) rotated (a host command's output for that child)", r)
	}
	return ""
}

//go:build integration

package tests

import (
	"bytes"
	"os"
	"testing"
)

// vmfork's test hooks are compiled into test builds only (-tags failpoints;
// make build writes bin/vmfork-failpoints): the tests that inject a fault
// run that binary for the command under the fault, named by
// VMFORK_FAILPOINTS_BIN, and the product binary for everything else (the
// repair included).
const (
	faultEnv      = "VMFORK_FAULT"            // fault_failpoints.go
	freezeFailEnv = "VMFORK_TEST_FREEZE_FAIL" // sharedmem/inject_failpoints.go
)

// failpointsBin is the CLI built with -tags failpoints.
func failpointsBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("VMFORK_FAILPOINTS_BIN")
	if bin == "" {
		t.Fatal("VMFORK_FAILPOINTS_BIN is not set: run the integration tests with `make integration` (make build writes bin/vmfork-failpoints)")
	}
	return bin
}

// withFailpoints returns e running the failpoints build: same dirs, same
// guest; the cleanup stays e's.
func (e *env) withFailpoints() *env {
	e.t.Helper()
	f := *e
	f.bin = failpointsBin(e.t)
	return &f
}

// withFailpoints is env.withFailpoints for a driverEnv.
func (d *driverEnv) withFailpoints() *driverEnv {
	d.t.Helper()
	f := *d
	f.env = d.env.withFailpoints()
	return &f
}

// TestFailpointsOnlyInTestBuild: the product binary holds no test hook's
// variable (`strings bin/vmfork | grep -E 'VMFORK_FAULT|VMFORK_TEST'` prints
// nothing: a user who set one would get a vmfork that kills itself or fails
// its freezes), and the failpoints build holds both, so the first check
// cannot pass because a name was spelled wrong.
func TestFailpointsOnlyInTestBuild(t *testing.T) {
	product := os.Getenv("VMFORK_BIN")
	if product == "" {
		t.Fatal("VMFORK_BIN is not set: run the integration tests with `make integration`")
	}
	holds := func(bin, s string) bool {
		t.Helper()
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		return bytes.Contains(data, []byte(s))
	}
	for _, s := range []string{"VMFORK_FAULT", "VMFORK_TEST"} {
		if holds(product, s) {
			t.Errorf("product binary %s holds %q: a test hook is compiled in without -tags failpoints", product, s)
		}
	}
	fp := failpointsBin(t)
	for _, s := range []string{faultEnv, freezeFailEnv} {
		if !holds(fp, s) {
			t.Errorf("failpoints build %s lacks %q: built without -tags failpoints?", fp, s)
		}
	}
}

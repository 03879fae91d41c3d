//go:build !failpoints

package sharedmem

// Inject never fails in the product: fault injection is compiled into test
// builds only (inject_failpoints.go, -tags failpoints).
func Inject(point string) error { return nil }

//go:build !failpoints

package vmfork

import "github.com/vmfork/vmfork/customize"

// Fault does nothing in the product: fault injection is compiled into test
// builds only (fault_failpoints.go, -tags failpoints), so no environment
// variable of a user's can make vmfork kill itself or a QEMU. The call
// inlines to nothing.
func Fault(point string, pid int) {}

// faultIdentity returns edit unchanged in the product.
func faultIdentity(edit func(customize.Chain) customize.Chain, _ *Machine) func(customize.Chain) customize.Chain {
	return edit
}

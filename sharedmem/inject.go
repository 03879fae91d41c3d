package sharedmem

// Fault-injection points of a freeze, the same in both drivers: the recipe
// calls Inject at each. In the product (built without the failpoints tag,
// inject_off.go) Inject never fails and reads nothing; a test build (go
// build -tags failpoints) fails where an integration test asks it to
// (inject_failpoints.go).
const (
	InjectAfterStop = "after-stop"
	InjectBeforeRAM = "before-ram"
	InjectAfterRAM  = "after-ram" // the source is remapped, not resumed
)

package profile

import "testing"

func TestFreePort(t *testing.T) {
	p, err := FreePort(0)
	if err != nil || p == 0 {
		t.Fatalf("FreePort(0) = %d, %v; want a port", p, err)
	}
}

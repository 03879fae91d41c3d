package qmp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// A command whose context has no deadline still ends when QEMU never
// answers: the client's call bound applies.
func TestExecuteBoundedWithoutDeadline(t *testing.T) {
	sock := qmptest.NewServer(t, qmptest.Expect("query-status").NoReply())
	m, err := qmp.Dial(t.Context(), sock, qmp.WithCallTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer m.Close()
	start := time.Now()
	err = m.Execute(context.Background(), "query-status", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Execute: got %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Execute returned after %v, want about 100ms", elapsed)
	}
}

// A caller's own deadline is kept, even when it is longer than the bound.
func TestExecuteKeepsCallerDeadline(t *testing.T) {
	sock := qmptest.NewServer(t, qmptest.Expect("query-status").NoReply())
	dctx, dcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer dcancel()
	m, err := qmp.Dial(dctx, sock, qmp.WithCallTimeout(10*time.Millisecond))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer m.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = m.Execute(ctx, "query-status", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Execute: got %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed < 250*time.Millisecond {
		t.Errorf("Execute returned after %v, want the caller's 300ms", elapsed)
	}
}

// An agent that never answers fails a call without a deadline too.
func TestAgentBoundedWithoutDeadline(t *testing.T) {
	sock := qmptest.NewAgentServer(t, qmptest.Expect("guest-ping").NoReply())
	a, err := qmp.DialAgent(t.Context(), sock, qmp.WithCallTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	defer a.Close()
	err = a.Ping(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ping: got %v, want context.DeadlineExceeded", err)
	}
}

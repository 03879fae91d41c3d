package qmp_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/vmfork/vmfork/qmp"
)

// replyExecutor is an Executor that is no Monitor (as libvirt's passthrough): it answers every
// command with the next canned reply, through EncodeCommand and DecodeReply.
type replyExecutor struct{ replies []string }

func (r *replyExecutor) Execute(ctx context.Context, cmd string, args, result any) error {
	if _, err := qmp.EncodeCommand(cmd, args); err != nil {
		return err
	}
	reply := r.replies[0]
	r.replies = r.replies[1:]
	return qmp.DecodeReply(cmd, []byte(reply), result)
}

func (r *replyExecutor) ExecuteWithFile(ctx context.Context, cmd string, args any, _ *os.File, result any) error {
	return r.Execute(ctx, cmd, args, result)
}

// A plain command over another Executor gets QEMU's error reply as an *Error.
func TestQueryVMGenerationIDOtherExecutor(t *testing.T) {
	ex := &replyExecutor{replies: []string{`{"error": {"class": "GenericError", "desc": "no vmgenid"}}`}}
	var qerr *qmp.Error
	if _, err := qmp.QueryVMGenerationID(t.Context(), ex); !errors.As(err, &qerr) || qerr.Desc != "no vmgenid" {
		t.Fatalf("QueryVMGenerationID: got %v, want a *qmp.Error", err)
	}
}

package qmptest

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// NewAgentServer starts a fake qemu-ga on a unix socket and returns the socket's path. Like
// qemu-ga it sends no greeting. It answers every guest-sync-delimited itself, as 0xFF followed by
// {"return": id}, after any replies held back by Late, and fails the test if the request was not
// preceded by 0xFF. Every other command must follow script. Connections are accepted one after
// another, and the script carries on across them, so a client may redial.
func NewAgentServer(tb testing.TB, script ...Step) string {
	tb.Helper()
	for i, st := range script {
		if st.fd != nil {
			tb.Fatalf("qmptest: step %d: the agent fake cannot receive file descriptors", i)
		}
	}
	return start(tb, true, script)
}

// readAgent returns the next command that is not a sync, answering syncs on the way.
func (ss *session) readAgent() (command, error) {
	for {
		line, err := ss.br.ReadBytes('\n')
		if err != nil {
			return command{}, err
		}
		// qemu-ga resets its parser at 0xFF, dropping any partial request before it.
		reset := false
		if i := bytes.LastIndexByte(line, 0xFF); i >= 0 {
			line, reset = line[i+1:], true
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var cmd command
		if err := json.Unmarshal(line, &cmd); err != nil {
			ss.s.errorf("client sent invalid JSON %q: %v", line, err)
			return command{}, err
		}
		if cmd.Execute != "guest-sync-delimited" {
			return cmd, nil
		}
		if !reset {
			ss.s.errorf("guest-sync-delimited was not preceded by 0xFF")
		}
		var args struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(cmd.Arguments, &args); err != nil || len(args.ID) == 0 {
			ss.s.errorf("guest-sync-delimited without an id: %s", cmd.Arguments)
			return command{}, errors.New("sync without id")
		}
		if err := ss.flushLate(); err != nil {
			return command{}, err
		}
		reply := append([]byte{0xFF}, `{"return": `...)
		reply = append(append(reply, args.ID...), "}\n"...)
		if err := ss.write(reply); err != nil {
			return command{}, err
		}
	}
}

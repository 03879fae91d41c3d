package qmp_test

import (
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// Debug logging names each command and its id, through the caller's logger only.
func TestWithLogger(t *testing.T) {
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	sock := qmptest.NewServer(t, qmptest.Expect("stop"))
	m, err := qmp.Dial(t.Context(), sock, qmp.WithLogger(logrus.NewEntry(logger)))
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer m.Close()
	if err := m.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	var cmds []string
	for _, e := range hook.AllEntries() {
		if cmd, ok := e.Data["qmp_cmd"].(string); ok {
			if e.Level != logrus.DebugLevel || e.Data["qmp_id"] == nil {
				t.Errorf("entry for %s: got level %v and id %v, want debug with an id", cmd, e.Level, e.Data["qmp_id"])
			}
			cmds = append(cmds, cmd)
		}
	}
	if len(cmds) != 2 || cmds[0] != "qmp_capabilities" || cmds[1] != "stop" {
		t.Errorf("logged commands: got %v, want [qmp_capabilities stop]", cmds)
	}
}

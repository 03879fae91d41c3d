package customize

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// fakeAgent is a guest agent that runs nothing. Commands are answered by
// handlers keyed by the program run, or, for /bin/sh -c, by the script; an
// unknown command fails the step, so a test notices it.
type fakeAgent struct {
	mu      sync.Mutex
	clock   time.Time // the guest's clock
	ifaces  []qmp.NetworkInterface
	scripts map[string]func(args []string) qmp.ExecStatus // by script
	progs   map[string]func(req qmp.ExecRequest) qmp.ExecStatus
	files   map[string][]byte
	pingErr error
	hang    bool // every call waits for its context to end

	calls   []string // one line per command, in order
	runs    []qmp.ExecRequest
	inputs  [][]byte         // the input of each part that had one
	hookEnv []string         // the environment the hooks part was given
	status  []qmp.ExecStatus // by pid-1
}

func newFakeAgent() *fakeAgent {
	return &fakeAgent{
		clock:   time.Unix(1000, 0),
		ifaces:  []qmp.NetworkInterface{{Name: "lo", HardwareAddress: "00:00:00:00:00:00"}, {Name: "eth0", HardwareAddress: "52:54:00:00:00:01"}},
		scripts: map[string]func([]string) qmp.ExecStatus{},
		progs:   map[string]func(qmp.ExecRequest) qmp.ExecStatus{},
		files:   map[string][]byte{},
	}
}

func ok(out string) qmp.ExecStatus { return qmp.ExecStatus{Exited: true, Stdout: []byte(out)} }

func (f *fakeAgent) record(ctx context.Context, call string) error {
	f.mu.Lock()
	f.calls = append(f.calls, call)
	hang := f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (f *fakeAgent) Ping(ctx context.Context) error {
	if err := f.record(ctx, "ping"); err != nil {
		return err
	}
	return f.pingErr
}

// Exec runs the command at once and keeps its status for ExecStatus.
func (f *fakeAgent) Exec(ctx context.Context, req qmp.ExecRequest) (int, error) {
	st, err := f.run(ctx, req)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	st.Exited = true
	f.status = append(f.status, st)
	return len(f.status), nil
}

func (f *fakeAgent) ExecStatus(ctx context.Context, pid int) (qmp.ExecStatus, error) {
	if err := f.record(ctx, "exec-status"); err != nil {
		return qmp.ExecStatus{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if pid < 1 || pid > len(f.status) {
		return qmp.ExecStatus{}, fmt.Errorf("fake agent: no pid %d", pid)
	}
	return f.status[pid-1], nil
}

func (f *fakeAgent) run(ctx context.Context, req qmp.ExecRequest) (qmp.ExecStatus, error) {
	if req.Path == "/bin/sh" && len(req.Args) > 3 && strings.HasPrefix(req.Args[1], batchHead) {
		return f.batch(ctx, req)
	}
	name := req.Path
	if req.Path == "/bin/sh" && len(req.Args) > 1 && req.Args[0] == "-c" {
		name = "sh:" + scriptName(req.Args[1])
	}
	if err := f.record(ctx, "run "+name); err != nil {
		return qmp.ExecStatus{}, err
	}
	f.mu.Lock()
	f.runs = append(f.runs, req)
	f.mu.Unlock()
	if req.Path == "/bin/sh" && len(req.Args) > 2 {
		if h, ok := f.scripts[req.Args[1]]; ok {
			return h(req.Args[3:]), nil
		}
	}
	if h, ok := f.progs[req.Path]; ok {
		return h(req), nil
	}
	return qmp.ExecStatus{}, fmt.Errorf("fake agent: unexpected command %s", name)
}

// batch runs a batch script the way its shell would: each part by the
// handler for its script, until one fails, with the output framed as the
// script frames it.
func (f *fakeAgent) batch(ctx context.Context, req qmp.ExecRequest) (qmp.ExecStatus, error) {
	body := strings.TrimPrefix(req.Args[1], batchHead)
	var parts []string
	for _, fn := range strings.Split(body, partEnd+"\n") {
		if _, def, ok := strings.Cut(fn, "() {\n"); ok {
			parts = append(parts, strings.TrimSuffix(def, "\n}"))
		}
	}
	args := req.Args[4:] // after -c, the script, $0 and the status file
	var names []string
	for _, p := range parts {
		names = append(names, scriptName(p))
	}
	if err := f.record(ctx, "batch "+strings.Join(names, ",")); err != nil {
		return qmp.ExecStatus{}, err
	}
	var out, errs strings.Builder
	for i, p := range parts {
		n := atoi(args[0])
		pargs := args[1 : 1+n]
		args = args[1+n:]
		f.mu.Lock()
		f.calls = append(f.calls, "run sh:"+names[i])
		h, ok := f.scripts[p]
		f.mu.Unlock()
		if !ok {
			return qmp.ExecStatus{}, fmt.Errorf("fake agent: unexpected part %s", names[i])
		}
		if p == sshScript {
			f.mu.Lock()
			f.inputs = append(f.inputs, []byte(envValue(req.Env, inputVar)))
			f.mu.Unlock()
		}
		st := h(pargs)
		fmt.Fprintf(&out, "%s part %d\n%s\n%s end %d %d %d\n", batchMark, i+1, st.Stdout, batchMark, i+1, st.ExitCode, 1000000)
		fmt.Fprintf(&errs, "%s part %d\n%s", batchMark, i+1, st.Stderr)
		if st.ExitCode != 0 && st.ExitCode != exitNothingToDo {
			break
		}
	}
	return qmp.ExecStatus{Exited: true, Stdout: []byte(out.String()), Stderr: []byte(errs.String())}, nil
}

// envValue is name's value in env, "" if it has none.
func envValue(env []string, name string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, name+"="); ok {
			return v
		}
	}
	return ""
}

// scriptName names the steps' scripts in call logs.
func scriptName(s string) string {
	for name, script := range map[string]string{
		"rng": rngScript, "hostname": hostnameScript, "machine-id": machineIDScript, "ssh": sshScript, "clock": dateScript,
		"journald": journaldScript, "mac": netDownScript, "dhcp": netUpScript, "hooks": hooksScript, "list": listScript, "run-script": runScript,
	} {
		if s == script {
			return name
		}
	}
	return "?"
}

func (f *fakeAgent) GetTime(ctx context.Context) (time.Time, error) {
	if err := f.record(ctx, "get-time"); err != nil {
		return time.Time{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clock, nil
}

func (f *fakeAgent) SetTime(ctx context.Context, t *time.Time) error {
	if err := f.record(ctx, "set-time"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clock = *t
	return nil
}

func (f *fakeAgent) WriteFile(ctx context.Context, path string, data []byte) error {
	if err := f.record(ctx, "write "+path); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[path] = data
	return nil
}

func (f *fakeAgent) ReadFile(ctx context.Context, path string) ([]byte, error) {
	if err := f.record(ctx, "read "+path); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[path]
	if !ok {
		return nil, fmt.Errorf("fake agent: open %s: no such file", path)
	}
	return b, nil
}

func (f *fakeAgent) NetworkInterfaces(ctx context.Context) ([]qmp.NetworkInterface, error) {
	if err := f.record(ctx, "interfaces"); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ifaces, nil
}

func (f *fakeAgent) callLog() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.calls, "\n")
}

// guest makes f answer the default chain's scripts like the test guest: no
// ssh-keygen, one hook, udhcpc giving 10.0.2.16.
func (f *fakeAgent) guest() *fakeAgent {
	f.scripts[rngScript] = func([]string) qmp.ExecStatus { return ok("reseeded\n") }
	f.scripts[hostnameScript] = func([]string) qmp.ExecStatus { return ok("") }
	f.scripts[machineIDScript] = func([]string) qmp.ExecStatus { return ok("") }
	f.scripts[journaldScript] = func([]string) qmp.ExecStatus { return ok("") }
	f.scripts[sshScript] = func([]string) qmp.ExecStatus { return ok("sshd reloaded (SIGHUP to pid 99)\n") }
	f.scripts[netDownScript] = func(args []string) qmp.ExecStatus {
		f.mu.Lock()
		defer f.mu.Unlock()
		for i := range f.ifaces {
			if f.ifaces[i].Name != args[0] {
				continue
			}
			f.ifaces[i].HardwareAddress = args[1]
			if args[2] == "static" {
				ip, n, _ := strings.Cut(args[3], "/")
				f.ifaces[i].IPAddresses = []qmp.IPAddress{{Type: "ipv4", Address: ip, Prefix: atoi(n)}}
			}
		}
		return ok("lease files emptied")
	}
	f.scripts[netUpScript] = func([]string) qmp.ExecStatus {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.ifaces[1].IPAddresses = []qmp.IPAddress{
			{Type: "ipv4", Address: "10.0.2.16", Prefix: 24},
			{Type: "ipv6", Address: "fe80::5054:ff:fe00:2", Prefix: 64},
		}
		return ok("udhcpc -q; gratuitous ARP (arp_notify)")
	}
	f.scripts[hooksScript] = func(args []string) qmp.ExecStatus {
		f.mu.Lock()
		f.hookEnv = args[1:]
		f.mu.Unlock()
		return ok("ran 10-example\n")
	}
	f.scripts[listScript] = func([]string) qmp.ExecStatus { return ok("10-example\n") }
	f.progs[PostForkDir+"/10-example"] = func(qmp.ExecRequest) qmp.ExecStatus { return ok("") }
	return f
}

func atoi(s string) int {
	n := 0
	fmt.Sscan(s, &n)
	return n
}

// fakeLink records link changes.
type fakeLink struct {
	mu  sync.Mutex
	ups []bool
}

func (l *fakeLink) SetLink(_ context.Context, up bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ups = append(l.ups, up)
	return nil
}

package qmp

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
)

// Guest-agent command names (qemu-ga 7.2, qga/qapi-schema.json).
const (
	AgentCmdPing              = "guest-ping"
	AgentCmdExec              = "guest-exec"
	AgentCmdExecStatus        = "guest-exec-status"
	AgentCmdFileOpen          = "guest-file-open"
	AgentCmdFileRead          = "guest-file-read"
	AgentCmdFileWrite         = "guest-file-write"
	AgentCmdFileClose         = "guest-file-close"
	AgentCmdSetTime           = "guest-set-time"
	AgentCmdGetTime           = "guest-get-time"
	AgentCmdGetOSInfo         = "guest-get-osinfo"
	AgentCmdNetworkInterfaces = "guest-network-get-interfaces"
	AgentCmdGetHostName       = "guest-get-host-name"
)

// Polling bounds for Run: short first, since most identity steps finish in milliseconds, then
// backing off so a long command does not flood the virtio-serial channel.
const (
	runPollMin = 20 * time.Millisecond
	runPollMax = 200 * time.Millisecond
)

// Agent is a qemu-ga client over a Transport. Its methods are safe for concurrent use; the
// transport runs one command at a time.
type Agent struct {
	t           Transport
	log         *logrus.Entry
	callTimeout time.Duration // see WithCallTimeout
}

// NewAgent returns an Agent that sends its commands through t.
func NewAgent(t Transport, opts ...Option) *Agent {
	o := buildOptions(opts)
	return &Agent{t: t, log: o.log, callTimeout: o.callTimeout}
}

// Close closes the transport.
func (a *Agent) Close() error { return a.t.Close() }

// Execute runs an agent command, like Monitor.Execute: nil args sends no "arguments", nil result
// ignores the return value, and an error reply is an *Error. Do not send commands that never reply
// (guest-shutdown, guest-suspend-*): the call would wait for a reply until ctx ends.
func (a *Agent) Execute(ctx context.Context, cmd string, args, result any) error {
	req, err := EncodeCommand(cmd, args)
	if err != nil {
		return err
	}
	ctx, cancel := bound(ctx, a.callTimeout)
	defer cancel()
	t0 := time.Now()
	raw, err := a.t.Command(ctx, req)
	// Logged once answered, with its round trip: the chain's time is
	// mostly these.
	a.log.WithFields(logrus.Fields{"qga_cmd": cmd, "ms": float64(time.Since(t0).Microseconds()) / 1000}).Debug("qga command")
	if err != nil {
		return fmt.Errorf("qmp: %s: %w", cmd, err)
	}
	return DecodeReply(cmd, raw, result)
}

// Ping checks that the agent answers.
func (a *Agent) Ping(ctx context.Context) error {
	return a.Execute(ctx, AgentCmdPing, nil, nil)
}

// ExecRequest is a program to run in the guest. The agent runs Path directly, without a shell.
type ExecRequest struct {
	Path          string
	Args          []string // arguments after Path, without argv[0]
	Env           []string // "KEY=value" entries; qemu-ga 7.2 replaces the environment with them
	Input         []byte   // written to the program's stdin, which is then closed
	CaptureOutput bool     // return stdout and stderr in ExecStatus
}

// ExecStatus is the reply of guest-exec-status.
type ExecStatus struct {
	Exited       bool   `json:"exited"`
	ExitCode     int    `json:"exitcode"` // valid when Exited and Signal is 0
	Signal       int    `json:"signal"`   // the signal that killed the program, or 0
	Stdout       []byte `json:"out-data"` // decoded from base64; qemu-ga caps it at 16 MiB
	Stderr       []byte `json:"err-data"`
	OutTruncated bool   `json:"out-truncated"`
	ErrTruncated bool   `json:"err-truncated"`
}

// Exec starts req in the guest and returns its pid for ExecStatus.
func (a *Agent) Exec(ctx context.Context, req ExecRequest) (int, error) {
	// encoding/json writes []byte as standard base64, which is what input-data must be.
	args := struct {
		Path          string   `json:"path"`
		Args          []string `json:"arg,omitempty"`
		Env           []string `json:"env,omitempty"`
		Input         []byte   `json:"input-data,omitempty"`
		CaptureOutput bool     `json:"capture-output,omitempty"`
	}{req.Path, req.Args, req.Env, req.Input, req.CaptureOutput}
	var r struct {
		PID int `json:"pid"`
	}
	if err := a.Execute(ctx, AgentCmdExec, args, &r); err != nil {
		return 0, err
	}
	return r.PID, nil
}

// ExecStatus reports on a program started by Exec. Once it reports Exited, qemu-ga forgets pid.
func (a *Agent) ExecStatus(ctx context.Context, pid int) (ExecStatus, error) {
	var st ExecStatus
	err := a.Execute(ctx, AgentCmdExecStatus, map[string]int{"pid": pid}, &st)
	return st, err
}

// Run starts req and polls until it exits, then returns its status. A non-zero exit code is not an
// error; the caller judges it. If ctx ends first the program keeps running in the guest.
func (a *Agent) Run(ctx context.Context, req ExecRequest) (ExecStatus, error) {
	pid, err := a.Exec(ctx, req)
	if err != nil {
		return ExecStatus{}, err
	}
	timer := time.NewTimer(runPollMin)
	defer timer.Stop()
	for delay := runPollMin; ; delay = min(2*delay, runPollMax) {
		st, err := a.ExecStatus(ctx, pid)
		if err != nil || st.Exited {
			return st, err
		}
		timer.Reset(delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			return st, fmt.Errorf("qmp: run %s (pid %d): %w", req.Path, pid, ctx.Err())
		}
	}
}

// SetTime sets the guest's clock to t and then writes it to the RTC. With t nil the guest instead
// reads its clock from the RTC, which QEMU keeps at host time. qemu-ga 7.2 runs /sbin/hwclock in
// both cases and fails without it.
func (a *Agent) SetTime(ctx context.Context, t *time.Time) error {
	var args any
	if t != nil {
		args = map[string]int64{"time": t.UnixNano()}
	}
	return a.Execute(ctx, AgentCmdSetTime, args, nil)
}

// GetTime returns the guest's clock.
func (a *Agent) GetTime(ctx context.Context) (time.Time, error) {
	var ns int64
	if err := a.Execute(ctx, AgentCmdGetTime, nil, &ns); err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, ns), nil
}

// OSInfo is the reply of guest-get-osinfo; members the guest does not report are empty.
type OSInfo struct {
	KernelRelease string `json:"kernel-release"`
	KernelVersion string `json:"kernel-version"`
	Machine       string `json:"machine"`
	ID            string `json:"id"`
	Name          string `json:"name"`
	PrettyName    string `json:"pretty-name"`
	Version       string `json:"version"`
	VersionID     string `json:"version-id"`
	Variant       string `json:"variant"`
	VariantID     string `json:"variant-id"`
}

// OSInfo reports the guest's kernel and distribution.
func (a *Agent) OSInfo(ctx context.Context) (OSInfo, error) {
	var info OSInfo
	err := a.Execute(ctx, AgentCmdGetOSInfo, nil, &info)
	return info, err
}

// NetworkInterface is one entry of guest-network-get-interfaces.
type NetworkInterface struct {
	Name            string      `json:"name"`
	HardwareAddress string      `json:"hardware-address"`
	IPAddresses     []IPAddress `json:"ip-addresses"`
}

// IPAddress is an address of a NetworkInterface.
type IPAddress struct {
	Type    string `json:"ip-address-type"` // "ipv4" or "ipv6"
	Address string `json:"ip-address"`
	Prefix  int    `json:"prefix"`
}

// NetworkInterfaces lists the guest's interfaces and addresses.
func (a *Agent) NetworkInterfaces(ctx context.Context) ([]NetworkInterface, error) {
	var ifs []NetworkInterface
	err := a.Execute(ctx, AgentCmdNetworkInterfaces, nil, &ifs)
	return ifs, err
}

// HostName returns the guest's host name. qemu-ga 7.2 cannot set it; run hostname through Run.
func (a *Agent) HostName(ctx context.Context) (string, error) {
	var r struct {
		HostName string `json:"host-name"`
	}
	err := a.Execute(ctx, AgentCmdGetHostName, nil, &r)
	return r.HostName, err
}

package customize

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Facts are what a fork child's chain may know of its guest before the
// child runs. ReadFacts reads them in the source just before its freeze,
// where the guest is warm and each read costs a few milliseconds; in a
// fresh child under TCG the same reads took 100-300 ms (os-release 55 ms,
// the interface list 33 ms, and on Debian the /proc scan for the DHCP client
// with its `tr`, 0.2-0.3 s). At the child's first instant they hold, unless
// the guest changed them between the read and the freeze; the steps check
// in the guest what a stale fact would get wrong (the DHCP client's pids by
// name). A nil field is unknown (a source that was stopped, a template kept
// by an older vmfork), and its step finds out for itself.
type Facts struct {
	// Date is "gnu" for a guest whose date takes relative times and whose
	// hwclock waits for a second boundary (a distribution), "busybox"
	// otherwise (clock.go).
	Date string `json:"date,omitempty"`
	// SSH holds the guest's SSH host key types.
	SSH *SSHFacts `json:"ssh,omitempty"`
	// NIC is the interface with the source's MAC.
	NIC *NICFacts `json:"nic,omitempty"`
	// DHCP is the DHCP client process that ran: none when PIDs is empty.
	DHCP *DHCPFacts `json:"dhcp,omitempty"`
}

// SSHFacts are the guest's SSH host key types; none when Types is empty.
type SSHFacts struct {
	Types []KeyType `json:"types"`
}

// NICFacts name the guest's NIC and the MAC it had.
type NICFacts struct {
	Name string `json:"name"`
	MAC  string `json:"mac"`
}

// DHCPFacts are the DHCP client processes (dhclient, udhcpc, dhcpcd) that
// ran, and the first one's command line.
type DHCPFacts struct {
	Clients []DHCPClient `json:"clients,omitempty"`
	Cmdline []string     `json:"cmdline,omitempty"`
}

// DHCPClient is a DHCP client process.
type DHCPClient struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm"`
}

// ReadFacts reads what a fork child's chain can know in advance from a
// running guest; macs are the MACs its NIC may have. What it cannot read it
// leaves unknown; the error says what that was.
func ReadFacts(ctx context.Context, a Agent, macs []string) (*Facts, error) {
	f := &Facts{Date: "busybox"}
	if hasGNUDate(ctx, a) {
		f.Date = "gnu"
	}
	var errs []string
	if types, err := HostKeyTypes(ctx, a); err == nil {
		f.SSH = &SSHFacts{Types: types}
	} else {
		errs = append(errs, "SSH host keys: "+err.Error())
	}
	if nic, mac, err := findNICMAC(ctx, a, macs); err == nil {
		f.NIC = &NICFacts{Name: nic, MAC: mac}
	} else {
		errs = append(errs, "NIC: "+err.Error())
	}
	if d, err := readDHCPFacts(ctx, a); err == nil {
		f.DHCP = d
	} else {
		errs = append(errs, "DHCP client: "+err.Error())
	}
	if len(errs) > 0 {
		return f, fmt.Errorf("read guest facts: %s", strings.Join(errs, "; "))
	}
	return f, nil
}

func readDHCPFacts(ctx context.Context, a Agent) (*DHCPFacts, error) {
	out, err := shell(ctx, a, "scan /proc", dhcpScanScript)
	if err != nil {
		return nil, err
	}
	d := &DHCPFacts{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		pid, comm, ok := strings.Cut(l, " ")
		n, err := strconv.Atoi(pid)
		if ok && err == nil && n > 0 {
			d.Clients = append(d.Clients, DHCPClient{PID: n, Comm: comm})
		}
	}
	if len(d.Clients) == 0 {
		return d, nil
	}
	first := d.Clients[0]
	b, err := a.ReadFile(ctx, "/proc/"+strconv.Itoa(first.PID)+"/cmdline")
	if err != nil {
		return nil, fmt.Errorf("command line of %s (pid %d): %w", first.Comm, first.PID, err)
	}
	for _, arg := range bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0}) {
		d.Cmdline = append(d.Cmdline, string(arg))
	}
	return d, nil
}

// arg returns the network script's argument for d: "PID:NAME" for each
// client, "0" for a guest where none ran, "-" when unknown.
func (d *DHCPFacts) arg() string {
	switch {
	case d == nil:
		return "-"
	case len(d.Clients) == 0:
		return "0"
	}
	s := make([]string, len(d.Clients))
	for i, c := range d.Clients {
		s[i] = strconv.Itoa(c.PID) + ":" + c.Comm
	}
	return strings.Join(s, " ")
}

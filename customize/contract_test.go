package customize

import (
	"os/exec"
	"strings"
	"testing"
)

// wcStub puts the host's wc on the fake guest's PATH.
func wcStub(t *testing.T, g *guestTree) {
	p, err := exec.LookPath("wc")
	if err != nil {
		t.Skip("no wc on this host")
	}
	g.stub("wc", `exec `+p+` "$@"`)
}

func TestConnectionsStep(t *testing.T) {
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		wcStub(t, g)
		// Two inherited connections until ss -K has run.
		g.stub("ss", `case "$*" in
*-K*) [ -e "$STUBROOT/killed" ] || printf 'ESTAB 0 0 10.0.2.15:40000 10.9.0.1:80\nESTAB 0 0 10.0.2.15:40002 10.9.0.1:443\n'; : >"$STUBROOT/killed" ;;
-V) ;;
*) [ -e "$STUBROOT/killed" ] || printf 'ESTAB 0 0 10.0.2.15:40000 10.9.0.1:80\nESTAB 0 0 10.0.2.15:40002 10.9.0.1:443\n' ;;
esac`)
		_, res, err := runOn(t, g, sh, nil, ConnectionsStep())
		if err != nil {
			t.Fatal(err)
		}
		if res.ConnectionsClosed != 2 || !strings.Contains(res.Steps[0].Detail, "closed 2 inherited") {
			t.Errorf("result %d, detail %q; want 2 closed", res.ConnectionsClosed, res.Steps[0].Detail)
		}
		if c := g.calls(); !strings.Contains(c, "ss -K -Htn state connected exclude time-wait ( ! dst 127.0.0.0/8") {
			t.Errorf("ss -K not run on the inherited connections only:\n%s", c)
		}
		// A kernel that cannot destroy them (ss -K closes nothing): the
		// step fails, naming why.
		g.stub("ss", `case "$*" in *-K*|-V) ;; *) printf 'ESTAB 0 0 10.0.2.15:40000 10.9.0.1:80\n' ;; esac`)
		if _, _, err := runOn(t, g, sh, nil, ConnectionsStep()); err == nil || !strings.Contains(err.Error(), "cannot destroy sockets") {
			t.Errorf("ss -K without effect: %v, want an error naming the kernel", err)
		}
	})
	// A guest without ss (newGuestTree's stub fails as a missing command
	// does) cannot enforce the contract: the step fails.
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		wcStub(t, g)
		if _, res, err := runOn(t, g, sh, nil, ConnectionsStep()); err == nil || !strings.Contains(err.Error(), "no ss (iproute2)") {
			t.Errorf("no ss: %v, want an error naming ss; %+v; calls:\n%s", err, res.Steps, g.calls())
		}
	})
}

func TestSecretsStep(t *testing.T) {
	stores := []TrustStore{
		{ID: "debian", File: "/usr/local/share/ca-certificates/vmfork.crt", Bundle: "/etc/ssl/certs/ca-certificates.crt", Update: []string{"update-ca-certificates"}},
		{ID: "fedora", File: "/etc/pki/ca-trust/source/anchors/vmfork.pem", Bundle: "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", Update: []string{"update-ca-trust", "extract"}},
	}
	files := map[string][]byte{
		"/etc/vmfork/secrets.env":   []byte("TOKEN=vmfork-secret-TOKEN-0123456789abcdef\nhttps_proxy=http://10.0.2.2:4000\n"),
		"/etc/vmfork/secrets/TOKEN": []byte("vmfork-secret-TOKEN-0123456789abcdef"),
		"/etc/vmfork/ca.pem":        []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
	}
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		g.file("/etc/os-release", "ID=ubuntu\nID_LIKE=debian\n")
		_, res, err := runOn(t, g, sh, nil, SecretsStep(files, "/etc/vmfork/ca.pem", stores))
		if err != nil {
			t.Fatal(err)
		}
		for p, c := range files {
			if got := g.read(p); got != string(c) {
				t.Errorf("%s = %q, want %q", p, got, c)
			}
		}
		if got := g.read("/usr/local/share/ca-certificates/vmfork.crt"); got != string(files["/etc/vmfork/ca.pem"]) {
			t.Errorf("trust store holds %q", got)
		}
		if d := res.Steps[0].Detail; !strings.Contains(d, "3 files") || !strings.Contains(d, "debian trust store") {
			t.Errorf("detail %q", d)
		}
	})
	// A guest with the bundle gets the CA appended to it, not the update
	// command's minute; its child, whose anchor holds the CA already,
	// leaves both alone.
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		fileTools(t, g)
		g.file("/etc/os-release", "ID=debian\n")
		g.file("/etc/ssl/certs/ca-certificates.crt", "-----BEGIN CERTIFICATE-----\nPUBLIC\n-----END CERTIFICATE-----\n")
		before := g.read("/etc/ssl/certs/ca-certificates.crt")
		_, res, err := runOn(t, g, sh, nil, SecretsStep(files, "/etc/vmfork/ca.pem", stores))
		if err != nil {
			t.Fatal(err)
		}
		ca := string(files["/etc/vmfork/ca.pem"])
		if got := g.read("/etc/ssl/certs/ca-certificates.crt"); got != before+"\n"+ca {
			t.Errorf("bundle = %q, want the old one and the CA", got)
		}
		if got := g.read("/usr/local/share/ca-certificates/vmfork.crt"); got != ca {
			t.Errorf("trust store holds %q", got)
		}
		if d := res.Steps[0].Detail; !strings.Contains(d, "its bundle (/etc/ssl/certs/ca-certificates.crt)") {
			t.Errorf("detail %q, want the bundle named", d)
		}
		_, res, err = runOn(t, g, sh, nil, SecretsStep(files, "/etc/vmfork/ca.pem", stores))
		if err != nil {
			t.Fatal(err)
		}
		if got := g.read("/etc/ssl/certs/ca-certificates.crt"); got != before+"\n"+ca {
			t.Errorf("a second run changed the bundle to %q", got)
		}
		if d := res.Steps[0].Detail; !strings.Contains(d, "already in the debian trust store") {
			t.Errorf("second run's detail %q", d)
		}
	})
	eachShell(t, func(t *testing.T, g *guestTree, sh []string) {
		g.file("/etc/os-release", "ID=vmfork-test\n")
		_, res, err := runOn(t, g, sh, nil, SecretsStep(files, "/etc/vmfork/ca.pem", stores))
		if err != nil || !strings.Contains(res.Steps[0].Detail, "no trust store known") {
			t.Errorf("unknown family: %v, detail %q; want the files written and the CA left in ca.pem, said so", err, res.Steps[0].Detail)
		}
	})
}

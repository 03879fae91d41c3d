package bench

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
)

// wellFormed fails the test unless data is well-formed XML with an svg root.
func wellFormed(t *testing.T, data []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(data))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, data)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
}

func TestFigureSVG(t *testing.T) {
	f := Figure{
		Title:   `fork <vs> "restore" & co`,
		Notes:   []string{"host: test"},
		Columns: 2,
		Panels: []Panel{
			BarPanel{Title: "time", Unit: "ms", Marks: []Mark{{Value: 50, Label: "budget", Color: "#f00"}}, Bars: []Bar{
				{Label: "vmfork", Segments: []Segment{{Name: "running", Value: 90, Color: "#00f"}, {Name: "ready", Value: 110, Color: "#0ff"}}},
				{Label: "restore", Segments: []Segment{{Name: "running", Value: 700, Color: "#00f"}}},
			}},
			LinePanel{Title: "curve", LogX: true, XTicks: []Tick{{256, "256M"}, {4096, "4G"}}, Series: []Series{
				{Name: "pause", Color: "#000", Dots: true, Points: []Point{{256, 70}, {4096, 300}}},
				{Name: "ready", Color: "#0a0", Step: true, Points: []Point{{256, 1}, {1024, 2}, {4096, 3}}},
			}},
		},
	}
	var b bytes.Buffer
	if err := f.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	s := b.String()
	for _, want := range []string{"fork &lt;vs&gt; &quot;restore&quot; &amp; co", ">vmfork<", ">200 ms<", ">budget<", ">256M<", "<polyline"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

func TestFigureEmptyPanels(t *testing.T) {
	// No data must still give a valid image, not NaN coordinates.
	f := Figure{Title: "empty", Panels: []Panel{BarPanel{Title: "none"}, LinePanel{Title: "none"}}}
	var b bytes.Buffer
	if err := f.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, b.Bytes())
	if strings.Contains(b.String(), "NaN") || strings.Contains(b.String(), "Inf") {
		t.Errorf("SVG has NaN or Inf coordinates:\n%s", b.String())
	}
}

func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		top  float64
		want []float64
	}{
		{7, []float64{0, 2, 4, 6, 8}},
		{100, []float64{0, 20, 40, 60, 80, 100}},
		{2310, []float64{0, 500, 1000, 1500, 2000, 2500}},
		{0, []float64{0, 1}},
	} {
		got := niceTicks(tc.top)
		if len(got) != len(tc.want) {
			t.Errorf("niceTicks(%v) = %v, want %v", tc.top, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("niceTicks(%v) = %v, want %v", tc.top, got, tc.want)
				break
			}
		}
	}
}

func TestResultFigures(t *testing.T) {
	for name, f := range map[string]Figure{
		"peers": samplePeers().Figure(),
		"burst": sampleBurst().Figure(),
		"scale": sampleScale().Figure(),
	} {
		var b bytes.Buffer
		if err := f.WriteSVG(&b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		wellFormed(t, b.Bytes())
		if strings.Contains(b.String(), "NaN") {
			t.Errorf("%s: NaN in SVG", name)
		}
	}
}

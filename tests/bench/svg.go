package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// The plots are plain SVG written by hand: a figure of panels, each a
// horizontal bar chart or a line chart. No dependency, and the files diff
// and render anywhere (browsers, GitHub, image viewers).

// Figure is one SVG image: a title, notes under it, and panels laid out in
// a grid of Columns columns.
type Figure struct {
	Title   string
	Notes   []string
	Columns int
	Panels  []Panel
}

// Panel is one chart in a figure.
type Panel interface {
	height(width float64) float64
	draw(c *canvas, x, y, width float64)
}

const (
	figWidth  = 1000.0
	figMargin = 16.0
	panelGap  = 20.0
	fontStack = "DejaVu Sans, Helvetica, Arial, sans-serif"
)

// WriteSVG writes f as a standalone SVG document.
func (f Figure) WriteSVG(w io.Writer) error {
	cols := max(f.Columns, 1)
	colW := (figWidth - 2*figMargin - float64(cols-1)*panelGap) / float64(cols)
	y := figMargin + 22
	body := &canvas{}
	body.text(figMargin, y, f.Title, 18, "start", "bold", "#212529")
	y += 8
	for _, n := range f.Notes {
		y += 17
		body.text(figMargin, y, n, 12, "start", "normal", "#495057")
	}
	y += 18
	for i := 0; i < len(f.Panels); i += cols {
		rowH := 0.0
		for j := i; j < min(i+cols, len(f.Panels)); j++ {
			x := figMargin + float64(j-i)*(colW+panelGap)
			f.Panels[j].draw(body, x, y, colW)
			rowH = max(rowH, f.Panels[j].height(colW))
		}
		y += rowH + panelGap
	}
	_, err := fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="%s">
<rect width="100%%" height="100%%" fill="#ffffff"/>
%s</svg>
`, figWidth, y, figWidth, y, fontStack, body.b.String())
	return err
}

// canvas collects SVG elements.
type canvas struct{ b strings.Builder }

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")

func (c *canvas) text(x, y float64, s string, size float64, anchor, weight, fill string) {
	fmt.Fprintf(&c.b, `<text x="%.1f" y="%.1f" font-size="%.0f" text-anchor="%s" font-weight="%s" fill="%s">%s</text>`+"\n",
		x, y, size, anchor, weight, fill, xmlEscaper.Replace(s))
}

func (c *canvas) rect(x, y, w, h float64, fill string) {
	fmt.Fprintf(&c.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, y, max(w, 0), h, fill)
}

func (c *canvas) line(x1, y1, x2, y2 float64, stroke string, width float64, dashed bool) {
	dash := ""
	if dashed {
		dash = ` stroke-dasharray="5,4"`
	}
	fmt.Fprintf(&c.b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"%s/>`+"\n",
		x1, y1, x2, y2, stroke, width, dash)
}

func (c *canvas) polyline(pts [][2]float64, stroke string, width float64, dashed bool) {
	var b strings.Builder
	for _, p := range pts {
		fmt.Fprintf(&b, "%.1f,%.1f ", p[0], p[1])
	}
	dash := ""
	if dashed {
		dash = ` stroke-dasharray="6,4"`
	}
	fmt.Fprintf(&c.b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="%.1f"%s/>`+"\n",
		strings.TrimSpace(b.String()), stroke, width, dash)
}

func (c *canvas) circle(x, y, r float64, fill string) {
	fmt.Fprintf(&c.b, `<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"/>`+"\n", x, y, r, fill)
}

// niceTicks returns tick values from 0 to at least top, 4-8 of them, on a
// 1-2-5 step.
func niceTicks(top float64) []float64 {
	if top <= 0 || math.IsNaN(top) || math.IsInf(top, 0) {
		return []float64{0, 1}
	}
	raw := top / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var t []float64
	for v := 0.0; ; v += step {
		t = append(t, v)
		if v >= top {
			return t
		}
	}
}

// fmtNum prints a value with as few digits as it needs.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case a == math.Trunc(a):
		return fmt.Sprintf("%.0f", v)
	case a < 10:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	case a < 100:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// Segment is one part of a stacked bar.
type Segment struct {
	Name  string
	Value float64
	Color string
}

// Bar is one labelled bar: segments drawn end to end, the total printed
// after it (or Text when set).
type Bar struct {
	Label    string
	Segments []Segment
	Text     string
}

// Mark is a labelled vertical line across a bar chart, e.g. a budget.
type Mark struct {
	Value float64
	Label string
	Color string
}

// BarPanel is a horizontal bar chart: easy to read with long labels. With
// Clip, a bar more than three times longer than all others is cut at the
// axis end (marked with a break and its full value), so that one outlier
// (a cold boot) does not squash the bars that are being compared.
type BarPanel struct {
	Title string
	Unit  string
	Bars  []Bar
	Marks []Mark
	Clip  bool
}

const (
	barH     = 20.0
	barGap   = 9.0
	barLabel = 190.0
	barValue = 110.0
	// labelCharW is a wide average character width of the sans-serif
	// font, per unit of font size.
	labelCharW = 0.55
)

func (p BarPanel) height(float64) float64 {
	return 30 + float64(len(p.Bars))*(barH+barGap) + 60
}

func (p BarPanel) draw(c *canvas, x, y, w float64) {
	c.text(x, y+14, p.Title, 14, "start", "bold", "#212529")
	top, second := 0.0, 0.0
	for _, b := range p.Bars {
		t := total(b.Segments)
		top, second = max(top, t), max(second, min(top, t))
	}
	if p.Clip && second > 0 && top > 3*second {
		top = 1.3 * second
	}
	for _, m := range p.Marks {
		top = max(top, m.Value)
	}
	ticks := niceTicks(top)
	scaleMax := ticks[len(ticks)-1]
	x0, plotW := x+barLabel, w-barLabel-barValue
	y0 := y + 30
	plotH := float64(len(p.Bars)) * (barH + barGap)
	px := func(v float64) float64 { return x0 + min(v, scaleMax)/scaleMax*plotW }
	for _, t := range ticks {
		c.line(px(t), y0-4, px(t), y0+plotH, "#e9ecef", 1, false)
		c.text(px(t), y0+plotH+14, fmtNum(t), 11, "middle", "normal", "#868e96")
	}
	c.text(x0+plotW+24, y0+plotH+14, p.Unit, 11, "start", "normal", "#868e96")
	// Marks first, so that bars and their values are drawn over them.
	for _, m := range p.Marks {
		c.line(px(m.Value), y0-6, px(m.Value), y0+plotH, m.Color, 1.5, true)
		c.text(px(m.Value), y0-9, m.Label, 11, "middle", "normal", m.Color)
	}
	legend := map[string]string{}
	var order []string
	for i, b := range p.Bars {
		by := y0 + float64(i)*(barH+barGap)
		// A label too long for its column gets a smaller font, not clipped.
		size := min(12, (barLabel-8)/(labelCharW*float64(len([]rune(b.Label)))))
		c.text(x0-8, by+barH*0.72, b.Label, size, "end", "normal", "#212529")
		at := 0.0
		for _, s := range b.Segments {
			c.rect(px(at), by, px(at+s.Value)-px(at), barH, s.Color)
			at += s.Value
			if s.Name != "" {
				if _, ok := legend[s.Name]; !ok {
					order = append(order, s.Name)
				}
				legend[s.Name] = s.Color
			}
		}
		if at > scaleMax { // clipped: a white break across the bar's end
			bx := px(scaleMax) - 14
			fmt.Fprintf(&c.b, `<polygon points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="#ffffff"/>`+"\n",
				bx, by-2, bx+5, by-2, bx+1, by+barH+2, bx-4, by+barH+2)
		}
		txt := b.Text
		if txt == "" {
			txt = fmtNum(at) + " " + p.Unit
		}
		c.text(px(at)+6, by+barH*0.72, txt, 12, "start", "bold", "#212529")
	}
	lx, ly := x0, y0+plotH+24
	for _, name := range order {
		iw := 24 + 6.5*float64(len(name))
		if lx > x0 && lx+iw > x+w {
			lx, ly = x0, ly+16
		}
		c.rect(lx, ly, 10, 10, legend[name])
		c.text(lx+14, ly+9, name, 11, "start", "normal", "#495057")
		lx += iw
	}
}

func total(s []Segment) float64 {
	t := 0.0
	for _, x := range s {
		t += x.Value
	}
	return t
}

// Point is one (x, y) of a series.
type Point struct{ X, Y float64 }

// Series is one line of a line chart. A Step series holds its value until
// the next point (a cumulative count).
type Series struct {
	Name   string
	Color  string
	Dashed bool
	Step   bool
	Dots   bool
	Points []Point
}

// Tick is a labelled x position.
type Tick struct {
	Value float64
	Label string
}

// LinePanel is a line chart. With LogX the x axis is logarithmic and
// XTicks should name the measured x values.
type LinePanel struct {
	Title, XLabel, YLabel string
	LogX                  bool
	XTicks                []Tick
	Series                []Series
	Height                float64
}

func (p LinePanel) height(float64) float64 {
	if p.Height > 0 {
		return p.Height
	}
	return 300
}

func (p LinePanel) draw(c *canvas, x, y, w float64) {
	h := p.height(w)
	c.text(x, y+14, p.Title, 14, "start", "bold", "#212529")
	x0, y0 := x+52, y+44
	plotW, plotH := w-52-12, h-44-78
	xmin, xmax, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, s := range p.Series {
		for _, pt := range s.Points {
			xmin, xmax, ymax = min(xmin, pt.X), max(xmax, pt.X), max(ymax, pt.Y)
		}
	}
	if math.IsInf(xmin, 1) {
		xmin, xmax = 0, 1
	}
	if !p.LogX {
		xmin = min(xmin, 0)
		if len(p.XTicks) == 0 {
			t := niceTicks(xmax)
			xmax = t[len(t)-1]
		}
	}
	fx := func(v float64) float64 { return v }
	if p.LogX {
		fx = math.Log2
	}
	span := fx(xmax) - fx(xmin)
	if span == 0 {
		span = 1
	}
	px := func(v float64) float64 { return x0 + (fx(v)-fx(xmin))/span*plotW }
	yt := niceTicks(ymax)
	py := func(v float64) float64 { return y0 + plotH - v/yt[len(yt)-1]*plotH }
	for _, t := range yt {
		c.line(x0, py(t), x0+plotW, py(t), "#e9ecef", 1, false)
		c.text(x0-6, py(t)+4, fmtNum(t), 11, "end", "normal", "#868e96")
	}
	xt := p.XTicks
	if len(xt) == 0 {
		for _, t := range niceTicks(xmax) {
			xt = append(xt, Tick{t, fmtNum(t)})
		}
	}
	for _, t := range xt {
		c.line(px(t.Value), y0+plotH, px(t.Value), y0+plotH+4, "#868e96", 1, false)
		c.text(px(t.Value), y0+plotH+17, t.Label, 11, "middle", "normal", "#868e96")
	}
	c.line(x0, y0+plotH, x0+plotW, y0+plotH, "#868e96", 1, false)
	c.text(x0+plotW/2, y0+plotH+34, p.XLabel, 12, "middle", "normal", "#495057")
	c.text(x0-6, y0-14, p.YLabel, 12, "start", "normal", "#495057")
	for _, s := range p.Series {
		var pts [][2]float64
		for i, pt := range s.Points {
			if s.Step && i > 0 {
				pts = append(pts, [2]float64{px(pt.X), py(s.Points[i-1].Y)})
			}
			pts = append(pts, [2]float64{px(pt.X), py(pt.Y)})
		}
		c.polyline(pts, s.Color, 2.2, s.Dashed)
		if s.Dots {
			for _, pt := range s.Points {
				c.circle(px(pt.X), py(pt.Y), 3.2, s.Color)
			}
		}
	}
	lx, ly := x0, y0+plotH+50
	for _, s := range p.Series {
		iw := 34 + 6.3*float64(len(s.Name))
		if lx > x0 && lx+iw > x+w {
			lx, ly = x0, ly+16
		}
		c.line(lx, ly, lx+18, ly, s.Color, 2.5, s.Dashed)
		c.text(lx+22, ly+4, s.Name, 11, "start", "normal", "#495057")
		lx += iw
	}
}

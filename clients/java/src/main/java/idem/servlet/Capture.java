package idem.servlet;

import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import jakarta.servlet.ReadListener;
import jakarta.servlet.ServletInputStream;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.Cookie;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletRequestWrapper;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;

/** The request body read once and replayed to the servlet; the servlet's answer held until the commit. */
final class Capture {
    private Capture() {
    }

    static final class Request extends HttpServletRequestWrapper {
        private final byte[] body;

        Request(HttpServletRequest r, byte[] body) {
            super(r);
            this.body = body;
        }

        @Override
        public ServletInputStream getInputStream() {
            ByteArrayInputStream in = new ByteArrayInputStream(body);
            return new ServletInputStream() {
                @Override public int read() { return in.read(); }
                @Override public int read(byte[] b, int off, int len) { return in.read(b, off, len); }
                @Override public boolean isFinished() { return in.available() == 0; }
                @Override public boolean isReady() { return true; }
                @Override public void setReadListener(ReadListener l) { throw new IllegalStateException("synchronous only"); }
            };
        }

        @Override
        public BufferedReader getReader() {
            String enc = getCharacterEncoding();
            return new BufferedReader(new InputStreamReader(new ByteArrayInputStream(body),
                enc == null ? StandardCharsets.UTF_8 : Charset.forName(enc)));
        }

        @Override
        public int getContentLength() {
            return body.length;
        }

        @Override
        public long getContentLengthLong() {
            return body.length;
        }
    }

    static final class Response extends HttpServletResponseWrapper {
        final ByteArrayOutputStream body = new ByteArrayOutputStream();
        final Map<String, List<String>> headers = new LinkedHashMap<>();   // lower-case names
        int status = 200;
        private PrintWriter writer;
        private ServletOutputStream stream;

        Response(HttpServletResponse r) {
            super(r);
        }

        byte[] bytes() {
            if (writer != null) {
                writer.flush();
            }
            return body.toByteArray();
        }

        @Override public void setStatus(int sc) { status = sc; }
        @Override public int getStatus() { return status; }
        @Override public void sendError(int sc) { status = sc; }
        @Override public void sendError(int sc, String msg) { status = sc; }
        @Override public void sendRedirect(String location) { status = 302; setHeader("Location", location); }
        // a null value removes the header (the servlet API's rule; Spring MVC resets headers so)
        @Override
        public void setHeader(String n, String v) {
            if (v == null) {
                headers.remove(n.toLowerCase());
            } else {
                headers.put(n.toLowerCase(), new ArrayList<>(List.of(v)));
            }
        }

        @Override
        public void addHeader(String n, String v) {
            if (v != null) {
                headers.computeIfAbsent(n.toLowerCase(), k -> new ArrayList<>()).add(v);
            }
        }

        @Override public void setIntHeader(String n, int v) { setHeader(n, Integer.toString(v)); }
        @Override public void addIntHeader(String n, int v) { addHeader(n, Integer.toString(v)); }
        @Override public void setDateHeader(String n, long v) { setHeader(n, httpDate(v)); }
        @Override public void addDateHeader(String n, long v) { addHeader(n, httpDate(v)); }
        @Override public boolean containsHeader(String n) { return headers.containsKey(n.toLowerCase()); }
        @Override public String getHeader(String n) { List<String> v = headers.get(n.toLowerCase()); return v == null ? null : v.get(0); }
        @Override public Collection<String> getHeaders(String n) { return headers.getOrDefault(n.toLowerCase(), List.of()); }
        @Override public Collection<String> getHeaderNames() { return headers.keySet(); }
        @Override public void setContentType(String t) { setHeader("Content-Type", t); }
        @Override public String getContentType() { return getHeader("content-type"); }
        @Override public void setContentLength(int len) { }
        @Override public void setContentLengthLong(long len) { }
        @Override public void setCharacterEncoding(String c) { }
        @Override public String getCharacterEncoding() { return "UTF-8"; }
        @Override public void flushBuffer() { }
        @Override public boolean isCommitted() { return false; }
        @Override public void reset() { body.reset(); headers.clear(); status = 200; }
        @Override public void resetBuffer() { body.reset(); }

        @Override
        public void addCookie(Cookie c) {
            StringBuilder s = new StringBuilder(c.getName()).append('=').append(c.getValue());
            if (c.getPath() != null) s.append("; Path=").append(c.getPath());
            if (c.getMaxAge() >= 0) s.append("; Max-Age=").append(c.getMaxAge());
            if (c.getSecure()) s.append("; Secure");
            if (c.isHttpOnly()) s.append("; HttpOnly");
            addHeader("Set-Cookie", s.toString());
        }

        @Override
        public ServletOutputStream getOutputStream() {
            if (stream == null) {
                stream = new ServletOutputStream() {
                    @Override public void write(int b) { body.write(b); }
                    @Override public void write(byte[] b, int off, int len) { body.write(b, off, len); }
                    @Override public boolean isReady() { return true; }
                    @Override public void setWriteListener(WriteListener l) { throw new IllegalStateException("synchronous only"); }
                };
            }
            return stream;
        }

        @Override
        public PrintWriter getWriter() {
            if (writer == null) {
                writer = new PrintWriter(new OutputStreamWriter(body, StandardCharsets.UTF_8));
            }
            return writer;
        }

        private static String httpDate(long millis) {
            return java.time.format.DateTimeFormatter.RFC_1123_DATE_TIME.format(
                java.time.Instant.ofEpochMilli(millis).atZone(java.time.ZoneOffset.UTC));
        }
    }
}
